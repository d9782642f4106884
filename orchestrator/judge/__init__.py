"""Judging: a verdict from measurements handed in (the canary's room, judge/canary/, so far; the folder move brings
the health gate and the PromQL client here)."""
