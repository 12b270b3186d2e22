"""What a teacher keeps, measured with canaries (``python -m vocagno.selection`` is its command line): the selection
a run makes (``settings``), a run of the report (``run``: rows drawn, mixed with noise, scored), what each variant
keeps (``measure``), and the report rendered (``report``: terminal, JSON, HTML)."""

from vocagno.diagnostics.selection.measure import measure
from vocagno.diagnostics.selection.report import Report
from vocagno.diagnostics.selection.run import run
from vocagno.diagnostics.selection.settings import Settings

__all__ = ["Report", "Settings", "measure", "run"]
