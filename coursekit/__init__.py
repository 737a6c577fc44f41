"""coursekit: a hands-on course on training neural networks on many GPUs.

Start with ``coursekit.launch`` (run a function on N ranks) and
``coursekit.Cluster`` (keep N ranks warm for interactive use).
"""

from .launch import ClusterClosed, Cluster, LaunchTimeout, RankError, launch, resolve_backend

__version__ = "0.1.0"

__all__ = ["launch", "Cluster", "RankError", "LaunchTimeout", "ClusterClosed", "resolve_backend", "__version__"]
