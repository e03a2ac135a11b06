"""Warm ranks: a preloaded interpreter per node (a zygote) from which each rank is forked and
then made what a fresh `python script.py` rank would be.

Agent side (torch-free): `zygote.Zygote` (start, fits, fork, close), `process.WarmProcess`
(what the agent uses of Popen), `command` (which commands and environments a zygote serves).
Zygote side: `zygote_main` (the process), `serve` (its loop); in each forked rank
`rank_start` (session, fds, env, binding, stdio), `libs` (thread pools, seeds), `proctitle`,
`script` (runs the user's code, exits as CPython). Nothing is imported here: the zygote imports
this package, and whatever it imports beyond the preload list is work every rank undoes.
"""
