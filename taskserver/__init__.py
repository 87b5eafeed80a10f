"""Task servers: the wire contract (Thrift IDL), queue policies and executors.

``queues`` (TF-EDFQ, T-EDFQ, PRIQ, FIFO), ``service_time`` and ``ownership`` (one owner
gateway at a time, on a lease) are pure; ``wire`` is the framed duplex Thrift link;
``server`` is the asyncio shell; ``lifecycle`` registers with the gateways, retires and
drains; ``registration`` makes the HTTP calls to the gateways.
Nothing here imports numpy, so edge agents can use the contract and queues.
"""
