"""hybrid: the parallelisms of chapters 02-06 composed on one ``pp × dp × sp × tp`` mesh (the capstone).

* ``degrees`` -- the mesh's four axes in torchtitan's order, and every check a layout must pass before it runs;
* ``suggest`` -- a refused layout's error: its reason and a change checked to fit (``LayoutError.suggestion``);
* ``layers`` -- the course transformer as layers for a pipeline, in its tensor- or sequence-parallel form;
* ``apply`` -- the composition: ``apply_tp``, ``apply_sp``, ``apply_pp``, ``apply_dp`` in torchtitan's order,
  each taking the model and the mesh and returning the model;
* ``strategy`` -- ``"hybrid"`` for :func:`coursekit.train.train`: the four applied in turn, then trained.
"""

from .degrees import AXES, check_degrees, layout_problem, mesh_shape, settings_problem
from .suggest import LayoutError, Refusal, nearest, refuse
from .layers import SequenceEmbedding, TensorParallelHead, composed_layers
from .apply import DataParallelPipeline, apply_dp, apply_pp, apply_sp, apply_tp
from .strategy import Hybrid

__all__ = ["AXES", "check_degrees", "mesh_shape", "layout_problem", "settings_problem", "LayoutError", "Refusal",
           "refuse", "nearest", "composed_layers", "apply_tp", "apply_sp", "apply_pp", "apply_dp",
           "DataParallelPipeline", "SequenceEmbedding",
           "TensorParallelHead", "Hybrid"]
