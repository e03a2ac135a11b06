"""Resident agents: one long-lived agent per node inside an allocation, many runs over one
membership. Node 0's agent listens on TCP for clients (`python -m agent run|status|down`) from the
allocation's shell, over an authenticated, encrypted channel (`wire`); the clients find it through
a per-job connection file (`connection`) and speak the request protocol in `client`.
"""
