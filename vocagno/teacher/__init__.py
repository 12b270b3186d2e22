"""The frozen teacher: ``model`` (``TeacherScorer``: loading, sharding, its loss per teacher token), ``side``
(``TeacherSide``: a teacher's tokens and alignment made from the student's), ``several`` (a set of teachers:
``TeacherSpec``, ``OtherTeachers``), ``scoring`` (the scoring pass: a ``Teacher`` and what ``scored_by`` records)."""
