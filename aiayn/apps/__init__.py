"""The ways out of a trained model: an HTTP server and its page, export to Hugging Face and
CTranslate2, pictures (attention maps, Figures 3-5; training curves)."""
