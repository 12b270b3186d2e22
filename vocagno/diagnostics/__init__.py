"""What a teacher keeps and why: ``canaries`` (clean text mixed with noise made from it), ``selection`` (the report,
measured with canaries), ``pages`` (what the HTML pages share)."""
