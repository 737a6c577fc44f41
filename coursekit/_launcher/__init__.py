"""The parts of :func:`coursekit.launch` and :class:`coursekit.Cluster`, one job per module.

In the order a launch uses them: :mod:`.start` has the one long-lived
:mod:`.starter` thread fork (or spawn) the ranks into a :class:`~.gang.Gang`;
each rank runs :mod:`.rank`, sets its signals in :mod:`.rank_signals` (Ctrl-C
is the parent's; it dies with its parent), joins the process group in
:mod:`.group` and talks back through :mod:`.rank_pipe`. The parent reads their
messages in :mod:`.inbox` and shows what they print with :mod:`.live` or
:mod:`.echo` (lines cut in :mod:`.lines`, the last ones kept in :mod:`.tail`),
explains a timeout or a crash with :mod:`.diagnose`, and stops every process in
:mod:`.teardown`. :mod:`.interrupts` sees that a Ctrl-C at any of these stages
reaches the caller. What a launch raises is in :mod:`.errors`. The public face,
and why it is built this way, is :mod:`coursekit.launch`.
"""
