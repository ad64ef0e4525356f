"""HTTP: translations served to clients who may be hostile.

Read first: app.py (`aiayn serve`: the routes and limits), then batcher.py (requests batched by
tokens) and edge.py (the connection limits in front of it).
"""

from ..doors import lazy

__all__ = ["Limits", "serve", "serving_hosts"]
__getattr__, __dir__ = lazy(__name__, {
    "serve": "app",
    "Limits": "app",
    "serving_hosts": "app",
})
