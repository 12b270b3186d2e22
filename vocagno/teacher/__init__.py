"""The frozen teacher: loading and scoring it (``model``), the teacher side of a batch of student tokens (``side``),
several teachers at once (``several``).
"""
