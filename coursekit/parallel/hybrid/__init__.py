"""hybrid: the parallelisms of chapters 02-06 composed on one ``pp × dp × sp × tp`` mesh (the capstone).

* ``degrees`` -- the mesh's four axes in torchtitan's order, and every check a layout must pass before it runs;
* ``layers`` -- the course transformer as layers for a pipeline, in its tensor- or sequence-parallel form;
* ``strategy`` -- ``"hybrid"`` for :func:`coursekit.train.train`: tensor, sequence, pipeline, then data
  parallelism applied in turn.
"""

from .degrees import AXES, check_degrees, mesh_shape
from .layers import SequenceBlock, SequenceEmbedding, TensorParallelHead, composed_layers
from .strategy import Hybrid

__all__ = ["AXES", "check_degrees", "mesh_shape", "composed_layers", "SequenceBlock", "SequenceEmbedding",
           "TensorParallelHead", "Hybrid"]
