"""What the course measures around the algorithms, never inside them.

* :mod:`.trace` -- spans of compute, communication and waiting per rank (:class:`~.trace.Tracer`);
* :mod:`.profile` -- torch.profiler on every rank, merged into one Perfetto trace (:func:`~.profile.merge_traces`);
* :mod:`.memory` -- the peak of model state and activations (:class:`~.memory.PeakMemory`, the ZeRO formula);
* :mod:`.live_memory` -- every tensor the ops create, counted from birth to free (:class:`~.live_memory.LiveMemory`);
* :mod:`.verify` -- a strategy's run against one process (:func:`~.verify.compare`);
* :mod:`.replicas` -- whether the replicas of a model still agree (:func:`~.replicas.check_replicas`);
* :mod:`.roofline` -- this machine's matmul peak and memory bandwidth, and where the course's ops sit under
  them (:func:`~.roofline.measure_roofline`, :func:`~.roofline.measure_op`).
"""
