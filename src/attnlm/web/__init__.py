"""The local attention explorer: ``attnlm serve`` (server, JSON API, offline page) and
standalone HTML views (:func:`attnlm.web.html.write_standalone`)."""
