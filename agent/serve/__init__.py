"""Resident agents: one long-lived agent per node inside an allocation, many runs over one
membership. Node 0's agent listens on TCP for clients (`python -m agent run|status|down`) from the
allocation's shell, over the authenticated, encrypted channel of agent.control (`wire`); the
clients find it through the per-job connection record (agent.control.connection) and speak the
request protocol in `client`.
"""
