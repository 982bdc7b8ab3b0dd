#!/usr/bin/env python3
"""The GPU gated-delta-rule backward's algorithm, stage by stage, in float64 NumPy, checked against
central finite differences of the token-by-token recurrence (DESIGN.md §1.2) with a gradient arriving at
the final state. Chunk 4, head dim 5, 13 tokens (a padded last chunk), so it runs in a second.

It mirrors delta_rule_backward.cu (prepare: γ, T, Ã, W, U, K̃, Q̂; states; the reverse state-gradient
pass) and delta_rule_backward_grads.cu (every dq/dk/dv/dβ/dγ term, the WY backward, the reverse
cumulative sum) formula for formula, so a wrong or missing term shows here without a GPU.

    python3 kernels/delta_rule/check_backward_math.py   # prints max |error| per gradient (~1e-10)
"""
import numpy as np
rng = np.random.default_rng(0)
T, D, C = 13, 5, 4
scale = 0.7
def nrm(x): return x / np.linalg.norm(x, axis=-1, keepdims=True)
q = nrm(rng.normal(size=(T, D))); k = nrm(rng.normal(size=(T, D))); v = rng.normal(size=(T, D))
g = -0.5 * rng.random(T); beta = rng.random(T)
s0 = 0.3 * rng.normal(size=(D, D)); dsf = 0.3 * rng.normal(size=(D, D)); dO = rng.normal(size=(T, D))

def forward(q, k, v, g, beta, s0):
    S = s0.copy(); O = np.zeros((T, D))
    for i in range(T):
        S = np.exp(g[i]) * S
        d = beta[i] * (v[i] - S.T @ k[i])
        S = S + np.outer(k[i], d)
        O[i] = S.T @ (q[i] * scale)
    return O, S

def loss(q, k, v, g, beta, s0):
    O, S = forward(q, k, v, g, beta, s0)
    return (O * dO).sum() + (S * dsf).sum()

def numgrad(name):
    args = dict(q=q, k=k, v=v, g=g, beta=beta, s0=s0)
    x = args[name]; G = np.zeros_like(x); eps = 1e-6
    it = np.nditer(x, flags=['multi_index'])
    for _ in it:
        idx = it.multi_index
        xp = x.copy(); xp[idx] += eps; xm = x.copy(); xm[idx] -= eps
        G[idx] = (loss(**{**args, name: xp}) - loss(**{**args, name: xm})) / (2 * eps)
    return G

N = (T + C - 1) // C
pad = N * C - T
P = lambda x: np.concatenate([x, np.zeros((pad,) + x.shape[1:])])
qp, kp, vp, gp, bp, dOp = P(q), P(k), P(v), P(g), P(beta), P(dO)
chunks = []
for c in range(N):
    sl = slice(c * C, (c + 1) * C)
    Q, K, V, gg, B = qp[sl], kp[sl], vp[sl], gp[sl], bp[sl]
    gam = np.cumsum(gg); E = np.exp(gam[:, None] - gam[None, :])
    low = np.tril(np.ones((C, C)), -1); lowi = np.tril(np.ones((C, C)))
    L = low * (B[:, None] * (K @ K.T) * np.where(low > 0, E, 0))
    Tm = np.linalg.inv(np.eye(C) + L)
    At = scale * lowi * (Q @ K.T) * np.where(lowi > 0, E, 0)
    W = Tm @ (B[:, None] * np.exp(gam)[:, None] * K); U = Tm @ (B[:, None] * V)
    Kt = np.exp(gam[-1] - gam)[:, None] * K; Qh = scale * np.exp(gam)[:, None] * Q
    chunks.append(dict(Q=Q, K=K, V=V, gam=gam, B=B, T=Tm, A=At, W=W, U=U, Kt=Kt, Qh=Qh, dO=dOp[sl]))
S = s0.copy()
for ch in chunks:
    ch['S'] = S.copy(); ch['Vn'] = ch['U'] - ch['W'] @ S
    S = np.exp(ch['gam'][-1]) * S + ch['Kt'].T @ ch['Vn']
dS = dsf.copy()
for ch in reversed(chunks):
    ch['dSn'] = dS.copy()
    ch['dVn'] = ch['A'].T @ ch['dO'] + ch['Kt'] @ dS
    dS = np.exp(ch['gam'][-1]) * dS + ch['Qh'].T @ ch['dO'] - ch['W'].T @ ch['dVn']
ds0 = dS
DQ, DK, DV, DB, DG = [], [], [], [], []
for ch in chunks:
    Q, K, V, gam, B, Tm, Sc, dSn, Vn, dVn, dOc = (ch[x] for x in 'Q K V gam B T S dSn Vn dVn dO'.split())
    eg = np.exp(gam); tail = np.exp(gam[-1] - gam)
    E = np.exp(np.minimum(gam[:, None] - gam[None, :], 50))
    low = np.tril(np.ones((C, C)), -1); lowi = np.tril(np.ones((C, C)))
    dgam = np.zeros(C); dbeta = np.zeros(C)
    dq = scale * eg[:, None] * (dOc @ Sc.T); dgam += (Q * dq).sum(1)
    dA = dOc @ Vn.T; dAm = lowi * scale * dA * E; Z = dAm * (Q @ K.T); dgam += Z.sum(1) - Z.sum(0)
    G2 = Vn @ dSn.T; dk = tail[:, None] * G2; y = (K * dk).sum(1); dgam -= y; extra = y.sum()
    dW = -dVn @ Sc.T; frob = (Sc * dSn).sum()
    dq += dAm @ K; dk += dAm.T @ Q
    x = Tm.T @ dVn; dv = B[:, None] * x; dbeta += (V * x).sum(1)
    x2 = Tm.T @ dW; dk += (B * eg)[:, None] * x2; p = (eg[:, None] * K * x2).sum(1); dbeta += p; dgam += B * p
    dT = dVn @ (B[:, None] * V).T + dW @ ((B * eg)[:, None] * K).T
    X = Tm.T @ dT; dL = -X @ Tm.T; M = low * dL; kk = K @ K.T; Lm = B[:, None] * kk * E * low
    dbeta += (M * kk * E).sum(1); dgam += (M * Lm).sum(1) - (M * Lm).sum(0)
    G = M * B[:, None] * E; dk += G @ K + G.T @ K
    dgam[-1] += extra + eg[-1] * frob
    dg = np.cumsum(dgam[::-1])[::-1]
    DQ.append(dq); DK.append(dk); DV.append(dv); DB.append(dbeta); DG.append(dg)
res = dict(q=np.concatenate(DQ)[:T], k=np.concatenate(DK)[:T], v=np.concatenate(DV)[:T],
           beta=np.concatenate(DB)[:T], g=np.concatenate(DG)[:T], s0=ds0)
worst = 0.0
for name in ['q', 'k', 'v', 'g', 'beta', 's0']:
    ng = numgrad(name)
    err = np.abs(res[name] - ng).max() / np.abs(ng).max()
    worst = max(worst, err)
    print(f"d{name}: max |error| / max |gradient| = {err:.1e}")
raise SystemExit(0 if worst < 1e-7 else 1)
