"""The hub's web console: server-rendered pages (Jinja2, htmx) over the browser session, and the live graph.

Routes: :mod:`tether.hub.console.routes`; graph WebSocket relay to kas: :mod:`tether.hub.console.graph_relay`.
"""
