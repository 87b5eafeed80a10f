"""Edge agents: sensing task servers for Raspberry-Pi clusters (no numpy, torch or onnxruntime).

Layout: ``store`` (SQLAlchemy Core sensor store; ``store_faults``: an emptied, corrupt
or full store; ``salvage``: the readable readings of a damaged one), ``readers``
(simulated, Linux IIO, external command), ``sensing`` (the task executor and its result
encoding), ``profiles`` (heterogeneity emulation for loopback testbeds), ``backfill``,
``config``, ``agent``
(the runtime on top of the task server shell) and ``metrics`` (the sampler's Prometheus
metrics). The agent's code path imports only the standard library, thriftpy2, SQLAlchemy
(uvloop if present; prometheus_client only for a metrics port) and ``taskserver``.

Errors::

    Exception
     ├── StoreError             the store cannot be opened, fails its check, or a query failed
     │    ├── StoreFull         a write refused by a full disk (committed rows all kept)
     │    └── UnknownSensor     no sensor of that name (the message lists the known ones)
     ├── ReaderError            one sensor read failed; logged and counted, never fatal
     ├── ExecutorError          (taskserver) a sensing task failed (the store); the message
     │    │                     goes back to the gateway
     │    └── InvalidTask       (taskserver) a sensing task's bad parameter, naming the field;
     │                          the gateway answers its client 400
     └── ValueError
          └── AgentConfigError  a bad option, named as on the command line
"""

from edge_agent.agent import Sampler, build_reader, run_agent, run_agents
from edge_agent.config import (
    AgentConfig,
    AgentConfigError,
    dense_agent_configs,
    load_agent_config,
)
from edge_agent.profiles import ServiceProfile, fit_profile, make_profile
from edge_agent.readers import (
    CommandReader,
    IioReader,
    ReaderError,
    SensorReader,
    SimulatedReader,
)
from edge_agent.sensing import SensingExecutor, decode_series
from edge_agent.store import SensorStore, StoreError, StoreFull, UnknownSensor

__all__ = [
    "AgentConfig",
    "AgentConfigError",
    "CommandReader",
    "IioReader",
    "ReaderError",
    "Sampler",
    "SensingExecutor",
    "SensorReader",
    "SensorStore",
    "ServiceProfile",
    "SimulatedReader",
    "StoreError",
    "StoreFull",
    "UnknownSensor",
    "build_reader",
    "decode_series",
    "dense_agent_configs",
    "fit_profile",
    "load_agent_config",
    "make_profile",
    "run_agent",
    "run_agents",
]
