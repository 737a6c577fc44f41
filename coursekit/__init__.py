"""coursekit: a hands-on course on training neural networks on many GPUs.

Start with ``coursekit.launch`` (run a function on N ranks) and
``coursekit.Cluster`` (keep N ranks warm for interactive use). ``coursekit.Mesh``
owns the process groups of a run; ``coursekit.train`` is the one training loop
every strategy plugs into.
"""

from .launch import ClusterClosed, Cluster, LaunchTimeout, RankError, launch, resolve_backend
from .comm.devices import default_backend, device
from . import comm
from .collectives import master_all_reduce, naive_all_reduce, ring_all_gather, ring_all_reduce, ring_reduce_scatter
from .comm.mesh import Mesh, rank_size
from .models import LanguageData, TeacherData, tiny_mlp, tiny_transformer
from .measure.trace import Tracer
from .measure.verify import assert_equivalent, compare
from .measure.replicas import ReplicaReport, check_replicas, nonfinite_ranks
from .train import train
from .measure.memory import PeakMemory
from .measure.live_memory import LiveMemory
from .collectives.hierarchical import hierarchical_all_reduce
from .parallel.pipeline import Schedule, ScheduleError, execute, make_schedule, plan, split, validate
from .parallel.tensor import ColumnParallelLinear, RowParallelLinear, ParallelMLP, ParallelSelfAttention
from .source import show
from .parallel.tensor import VocabParallelEmbedding, gather_dense, parallelize_transformer, vocab_parallel_cross_entropy

__version__ = "0.1.0"


__all__ = ["launch", "Cluster", "RankError", "LaunchTimeout", "ClusterClosed", "resolve_backend", "default_backend", "device", "__version__",
           "tiny_mlp", "tiny_transformer", "LanguageData", "TeacherData", "Tracer", "compare", "assert_equivalent",
           "comm", "Mesh", "rank_size", "train", "naive_all_reduce", "master_all_reduce", "ring_reduce_scatter",
           "ring_all_gather", "ring_all_reduce", "hierarchical_all_reduce", "PeakMemory", "LiveMemory",
           # chapters 03-04: stages, pipeline schedules as data, their executor
           "split", "Schedule", "ScheduleError", "make_schedule", "plan", "validate", "execute",
           # chapter 05: Megatron-LM tensor parallelism
           "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention",
           "parallelize_transformer", "gather_dense", "VocabParallelEmbedding", "vocab_parallel_cross_entropy",
           # chapter 09: do the replicas agree, and where did a NaN come in
           "check_replicas", "ReplicaReport", "nonfinite_ranks",
           # every chapter: the library's own code, shown
           "show"]
