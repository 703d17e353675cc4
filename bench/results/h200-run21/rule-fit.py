"""Which calls past the decode rows should run the dx at the key's own T rather than T = 8:
simple rules (own T from C chunks and E Mi elements) scored over every whole-call measurement of
bench/bwd_parts.py --small-rows (17th, 20th and 21st leases), as the sum of the chosen T's times
against the best T's, and the worst misses. Run from the repository root; its output is
rule-fit.txt (runtime.DEFAULT_OWN_T_ELEMENTS)."""
import re
srcs={'r17':('default','bench/results/h200-run17/bwd-small.log'),
'r20a':('default','bench/results/h200-run20/bwd-small-a.log'),
'r20b':('default','bench/results/h200-run20/bwd-small-b.log'),
'r20t':('tuned','bench/results/h200-run20/rule-tuned.log'),
'r21d':('default','bench/results/h200-run21/rule-default.log'),
'r21t128':('tuned','bench/results/h200-run21/rule-tuned-128.log'),'r21t512':('tuned','bench/results/h200-run21/rule-tuned-512.log'),'r21tw':('tuned','bench/results/h200-run21/rule-tuned-wide.log')}
def dbr(h): return 2048 if h<=2048 else 1024
pts=[]
for s,(kind,f) in srcs.items():
    for line in open(f):
        m=re.match(r'(\w+)\s+H=\s*(\d+) rows=\s*(\d+) picked',line)
        if not m: continue
        n,h,r=m.group(1),int(m.group(2)),int(m.group(3))
        ts=dict((k,float(v)) for k,v in re.findall(r' T(\d+)\s+([\d.]+) \(err',line))
        if r<=dbr(h) or '8' not in ts: continue
        own=[int(k) for k in ts if k not in ('1','8')]
        if not own: continue
        o=own[0]
        pts.append((s,kind,n,h,r,o,ts['8'],ts[str(o)]))
print(len(pts))
def ev(rule,label):
    tot=best=0; worst=[]
    for p in pts:
        s,kind,n,h,r,o,t8,to=p
        c=to if rule(h,r,o,kind) else t8
        tot+=c; best+=min(t8,to); worst.append((c/min(t8,to),p))
    worst.sort(reverse=True)
    print(f"{label:40s} sum {tot:8.1f} best {best:8.1f}  worst " + "; ".join(f"{w:.2f} {p[0]} {p[2][:3]} {p[3]}x{p[4]} T{p[5]} {p[6]}/{p[7]}" for w,p in worst[:4]))
ev(lambda h,r,o,k: -(-r//o)>=256,'current (256 chunks)')
for E in (4,6,8,10,12,14,16):
    ev(lambda h,r,o,k,E=E: -(-r//o)>=256 and r*h>=E<<20,f'256 chunks and {E}M elems')
    ev(lambda h,r,o,k,E=E: r*h>=E<<20,f'{E}M elems')
for C in (128,256,512,1024):
  for E in (6,8,12):
    ev(lambda h,r,o,k,E=E,C=C: -(-r//o)>=C and r*h>=E<<20,f'{C} chunks and {E}M elems')
print("---- by kind")
allp=pts
for kind in ('tuned','default'):
    pts=[p for p in allp if p[1]==kind]
    print(kind,len(pts))
    ev(lambda h,r,o,k: -(-r//o)>=256,'current (256 chunks)')
    for C in (64,128,256):
      for E in (0,6,8,10,12,16):
        ev(lambda h,r,o,k,E=E,C=C: -(-r//o)>=C and r*h>=E<<20,f'{C} chunks and {E}M elems')
