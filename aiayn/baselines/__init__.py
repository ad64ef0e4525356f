"""The families the Transformer replaced (§1-2, Table 2): recurrent encoder-decoders with attention."""
