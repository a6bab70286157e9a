import json, random, math, sys
import mpmath as mp
tcache={}
def tq(p,dof):
    k=(round(p,12),dof)
    if k not in tcache:
        f=lambda t: 1-0.5*float(mp.betainc(dof/2,0.5,0,dof/(dof+t*t),regularized=True))-p
        lo,hi=0.0,1.0
        while f(hi)<0: hi*=2
        for _ in range(100):
            mid=(lo+hi)/2
            if f(mid)<0: lo=mid
            else: hi=mid
        tcache[k]=(lo+hi)/2
    return tcache[k]
def units(path, per=int(__import__("os").environ.get("PER","4"))):
    ch=[json.loads(l) for l in open(path)]
    c=[(x['sum_kld'],x['count']) for x in ch]
    return [(sum(a for a,_ in c[i:i+per]), sum(b for _,b in c[i:i+per])) for i in range(0,len(c),per)]
def run(U, order, minu, conf, thr, inflate=1.0):
    N=len(U); looks=N; seen=[]
    for i in order:
        seen.append(U[i]); m=len(seen)
        tok=sum(b for _,b in seen); r=sum(a for a,_ in seen)/tok
        if m>=N: return m, r, r, r, 'complete'
        if m<max(minu,2): continue
        nb=tok/m
        var=sum((a-r*b)**2 for a,b in seen)/(m-1)
        se=math.sqrt(var*(1-m/N)/m)/nb*inflate
        a=(1-conf)/looks
        h=tq(1-a/2,m-1)*se
        lo,hi=r-h,r+h
        if thr<lo or thr>hi: return m,r,lo,hi,'decided'
    return N,r,r,r,'complete'
for path in ['Q8_0.jsonl','q41.jsonl','Q2_K.jsonl']:
    U=units(path); mu=sum(a for a,_ in U)/sum(b for _,b in U)
    gm=[a/b for a,b in U]
    print(path, 'mean',round(mu,5),'unit means', [round(x,4) for x in sorted(gm)])
    for minu in [int(a) for a in sys.argv[1:]]:
        for thr in [0.5*mu,0.75*mu,0.9*mu,1.1*mu,1.5*mu,2*mu]:
            miss=0; early=0; meas=0; R=2000
            for s in range(R):
                rnd=random.Random(s); o=list(range(len(U))); rnd.shuffle(o)
                m,r,lo,hi,why=run(U,o,minu,0.99,thr)
                meas+=m
                if why=='decided':
                    early+=1; miss+= not (lo<=mu<=hi)
            print(f'  min {minu} thr {thr/mu:.2f}x: early {early/R:.2f} measured {meas/R:.1f} miss {miss/R:.4f}')
