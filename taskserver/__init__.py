"""Task servers: the wire contract (Thrift IDL), queue policies and executors.

``queues`` (TF-EDFQ, T-EDFQ, PRIQ, FIFO) and ``service_time`` are pure;
``wire`` is the framed duplex Thrift link; ``server`` is the asyncio shell.
Nothing here imports numpy, so edge agents can use the contract and queues.
"""
