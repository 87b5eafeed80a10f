"""Discrete-event simulator running the live policy objects on a virtual clock.

``scenario`` parses scenario files, ``workload`` draws queries with common
random numbers, ``engine`` simulates them (CdfBook/DeadlineEstimator for
budgets, TaskQueue per server), ``report`` computes tails per class and
fanout type, ``maxload`` bisects the load, ``experiments`` runs the named
experiments, ``cli`` is ``tailgate sim``.
"""
