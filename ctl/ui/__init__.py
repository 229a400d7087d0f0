"""``ctl ui``: a local, read-only web view of a home's runs (docs/ui.md).

``command.ui`` is the click command; ``server`` serves ``pages`` (data from ctl's read layer:
``runstatus``, ``runview``, ``historyview``, ``plot``, ``show``; ``releases``: ModelRelease results)
through jinja2 templates with SVG charts (``curves`` decides what each chart holds, ``svg`` draws). jinja2 is the optional extra ``[ui]``, imported only when ``ctl ui`` runs.
"""
