"""HTTP over gRPC (``grpctool.HttpRequest`` / ``HttpResponse``, kas.md §5.2), both directions, in one place.

- the calling side encodes a request and decodes the response: :mod:`.proxy_call` (an HTTP request kas
  received, streamed; the Kubernetes API proxy and workspace access) and :mod:`.buffered` (a whole request in
  memory; agentk's requests to the hub through ``gitlab_access``);
- the serving side decodes a request and encodes the response: :mod:`.outbound` (a request agentk makes to an
  HTTP server, streamed) and :mod:`.buffered` (kas' ``gitlab_access``, which sends it to the hub);
- :mod:`.headers` holds the header rules both sides apply; :mod:`.hijack` and :mod:`.upgrade_client` carry the
  raw bytes of an upgraded connection.

Every side checks the frame order with ``tool/automaton`` from the ``.proto`` options.
"""
