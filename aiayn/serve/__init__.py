"""HTTP: translations served to clients who may be hostile.

Read first: app.py (`aiayn serve`: the routes), then batcher.py (requests batched by tokens),
edge.py (the limits and the connection rules in front of it), pool.py (many checkpoints behind one
server) and health.py (what /health says).
"""

from ..doors import lazy

__all__ = ["Limits", "ModelPool", "serve", "serving_hosts"]
__getattr__, __dir__ = lazy(__name__, {
    "serve": "app",
    "Limits": "edge",
    "ModelPool": "pool",
    "serving_hosts": "app",
})
