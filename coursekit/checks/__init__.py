"""checks: the graded checks of each chapter's exercise (registered with :mod:`coursekit.grading`)."""
