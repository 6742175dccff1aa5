"""The fairness arithmetic of examples/fair-queue, shared by run.py and analyze.py.

- waterfill: weighted max-min fair shares of one capacity given each tenant's demand
  (a tenant gets min(its demand, its weight x the level), the level set so that the
  capacity is used up or every demand is met).
- feasible: whether per-tenant totals can be carried by the nodes, given per-(tenant,
  node) demand caps and per-node capacities (a max flow: source -> tenant (its total)
  -> node (its demand there) -> sink (the node's capacity)).
- local_fq / local_drl: what fair queues with fixed local weights, and token buckets at
  fixed local shares, give each tenant at each node (the models of the fq-static-weights
  and static-drl baselines).
"""
from collections import deque


def waterfill(demand, weight, capacity):
    """{tenant: share}: weighted max-min fair shares of `capacity` under `demand`."""
    alloc = {t: 0.0 for t in demand}
    active = {t for t in demand if demand[t] > 0 and weight[t] > 0}
    remaining = float(capacity)
    while active and remaining > 1e-12:
        total = sum(weight[t] for t in active)
        level = remaining / total
        met = [t for t in active if demand[t] <= level * weight[t]]
        if not met:
            for t in active:
                alloc[t] = level * weight[t]
            break
        for t in met:
            alloc[t] = float(demand[t])
            remaining -= demand[t]
            active.discard(t)
    return alloc


def _max_flow(n, edges, s, t):
    graph = [[] for _ in range(n)]
    to, cap = [], []
    for u, v, c in edges:
        graph[u].append(len(to))
        to.append(v)
        cap.append(float(c))
        graph[v].append(len(to))
        to.append(u)
        cap.append(0.0)
    flow = 0.0
    while True:
        prev = [-1] * n
        prev[s] = -2
        q = deque([s])
        while q and prev[t] == -1:
            u = q.popleft()
            for e in graph[u]:
                if cap[e] > 1e-9 and prev[to[e]] == -1:
                    prev[to[e]] = e
                    q.append(to[e])
        if prev[t] == -1:
            return flow
        b = float("inf")
        v = t
        while v != s:
            e = prev[v]
            b = min(b, cap[e])
            v = to[e ^ 1]
        v = t
        while v != s:
            e = prev[v]
            cap[e] -= b
            cap[e ^ 1] += b
            v = to[e ^ 1]
        flow += b


def feasible(totals, demand_tn, capacity_n):
    """The fraction (0..1) of sum(totals) that the nodes can carry: 1.0 when every
    tenant can get its total without exceeding a per-(tenant, node) demand or a node's
    capacity. totals: {tenant: x}; demand_tn: {(tenant, node): d}; capacity_n:
    {node: c}."""
    tenants = sorted(totals)
    nodes = sorted(capacity_n)
    ti = {t: 1 + i for i, t in enumerate(tenants)}
    ni = {n: 1 + len(tenants) + i for i, n in enumerate(nodes)}
    sink = 1 + len(tenants) + len(nodes)
    edges = [(0, ti[t], totals[t]) for t in tenants]
    edges += [(ti[t], ni[n], d) for (t, n), d in demand_tn.items() if t in ti and n in ni]
    edges += [(ni[n], sink, capacity_n[n]) for n in nodes]
    want = sum(totals.values())
    if want <= 0:
        return 1.0
    return min(1.0, _max_flow(sink + 1, edges, 0, sink) / want)


def local_fq(demand_tn, weight, capacity_n):
    """{tenant: total}: fair queues at every node with local weights = `weight`."""
    out = {t: 0.0 for (t, _) in demand_tn}
    for n, c in capacity_n.items():
        d = {t: v for (t, m), v in demand_tn.items() if m == n}
        for t, x in waterfill(d, {t: weight[t] for t in d}, c).items():
            out[t] += x
    return out


def local_drl(demand_tn, weight, capacity_n):
    """{tenant: total}: a token bucket per tenant at every node at its static share
    (weight / the weights of the node's tenants x the node's capacity)."""
    out = {t: 0.0 for (t, _) in demand_tn}
    for n, c in capacity_n.items():
        d = {t: v for (t, m), v in demand_tn.items() if m == n}
        total = sum(weight[t] for t in d)
        for t, v in d.items():
            out[t] += min(v, weight[t] / total * c)
    return out


def mmr(achieved, weight, tenants):
    """Min-max ratio of the normalised throughput achieved / weight over `tenants`."""
    r = [achieved[t] / weight[t] for t in tenants]
    if not r or max(r) <= 0:
        return 0.0
    return min(r) / max(r)


def max_error_pct(achieved, fair):
    """The largest |achieved - fair| / fair over tenants with a fair share, in %."""
    e = [abs(achieved[t] - fair[t]) / fair[t] for t in fair if fair[t] > 0]
    return 100.0 * max(e) if e else 0.0
