"""Admission control and autoscaling policies driven by the task deadline-miss ratio."""
