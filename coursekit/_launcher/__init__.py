"""The parts of :func:`coursekit.launch` and :class:`coursekit.Cluster`, one job per module.

In the order a launch uses them: :mod:`.start` forks (or spawns) the ranks into
a :class:`~.gang.Gang`; each rank runs :mod:`.rank`, joins the process group in
:mod:`.group` and talks back through :mod:`.rank_pipe`. The parent reads their
messages in :mod:`.inbox` and shows what they print with :mod:`.live` or
:mod:`.echo` (lines cut in :mod:`.lines`, the last ones kept in :mod:`.tail`),
explains a timeout or a crash with :mod:`.diagnose`, and stops every process in
:mod:`.teardown`. What a launch raises is in :mod:`.errors`. The public face,
and why it is built this way, is :mod:`coursekit.launch`.
"""
