"""The gateway: HTTP API, TailGuard deadlines from online CDFs, fanout dispatch.

Layout: ``cdf``/``tail``/``deadlines`` are the pure TailGuard math (CDF book,
peaks-over-threshold tail, x_p^u and t_D); ``requests`` validates bodies;
``links`` holds one Thrift connection per task server; ``service`` is the
query path; ``app`` is the aiohttp shell; ``config`` the typed settings;
``waits`` the queue-wait estimates per server link (QLM §6);
``request_path`` runs multi-query requests stage by stage (``stages``: their SLOs);
``tenants``/``allocation``/``deferral`` the allocation layer (fair share between
tenants in central queues, admission and deferrals);
``metrics`` the Prometheus metrics; ``history`` the sampled time series and its
store; ``dashboard`` the built-in page (its files in ``static/``); ``auth`` who may
call which route (pure: credentials, the decision, key limits), ``refusals`` refused
requests counted per source, and ``guard`` the aiohttp middleware over both and the token
files it re-reads.
"""
