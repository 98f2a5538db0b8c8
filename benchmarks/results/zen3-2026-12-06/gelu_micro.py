import time, torch, torch.nn.functional as F, numpy as np
torch.set_num_threads(2)
C=384
w=torch.randn(4*C,C)*0.02; b=torch.zeros(4*C); p=torch.ops.mkldnn._reorder_linear_weight(w,None)
for M in (16, 256, 4096):
    x=torch.randn(M,C)
    fs={"fused": lambda: torch.ops.mkldnn._linear_pointwise(x,p,b,"gelu",[],"none"),
        "none": lambda: torch.ops.mkldnn._linear_pointwise(x,p,b,"none",[],""),
        "sep": lambda: F.gelu(torch.ops.mkldnn._linear_pointwise(x,p,b,"none",[],"")),
        "sep_inplace": lambda: torch.ops.aten.gelu_(torch.ops.mkldnn._linear_pointwise(x,p,b,"none",[],""))}
    n = max(1, 4096 // M)
    ts={k:[] for k in fs}
    for _ in range(11):
        for k,f in fs.items():
            t=time.perf_counter()
            for _ in range(n): f()
            ts[k].append((time.perf_counter()-t)/n)
    print(M, {k:f"{1e3*np.median(v):.3f}" for k,v in ts.items()})
h=torch.randn(4096,4*C)
ts=[]
for _ in range(11):
    t=time.perf_counter(); F.gelu(h); ts.append(time.perf_counter()-t)
print("gelu alone 4096x1536", f"{1e3*np.median(ts):.2f} ms")
