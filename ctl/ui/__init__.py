"""``ctl ui``: a local, read-only web view of a home's runs (docs/ui.md).

``command.ui`` is the click command; ``server`` serves ``pages`` (data from ctl's read layer:
``runstatus``, ``runview``, ``historyview``, ``plot``) through jinja2 templates with SVG charts
(``svg``). jinja2 is the optional extra ``[ui]``, imported only when ``ctl ui`` runs.
"""
