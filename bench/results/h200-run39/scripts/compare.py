import json, sys, glob, collections, math
d, prefix = sys.argv[1], sys.argv[2]
best = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(f"{d}/{prefix}-*.json")):
    lib = f.split(f"{prefix}-")[1][0]
    for r in json.load(open(f))["records"]:
        if r.get("us") is None: continue
        best[(r["op"], r["hidden"], r["rows"])][lib].append(r["us"])
libs = sorted({l for v in best.values() for l in v})
logs = collections.defaultdict(list)
for k in sorted(best):
    v = best[k]; m = {l: min(v[l]) for l in libs if l in v}
    ref = m.get("N", m.get("B"))
    line = f"{k[0]:18s} {k[1]:5d} {k[2]:7d} " + "  ".join(f"{l} {m[l]:7.2f}" for l in m)
    if "N" in m:
        line += "  " + "  ".join(f"N/{l} {m['N']/m[l]:.3f}" for l in m if l != "N")
        for l in m:
            if l != "N": logs[(k[0], l)].append(math.log(m["N"] / m[l]))
    else:
        line += f"  B/C {m['B']/m['C']:.3f}"
        logs[(k[0], "B/C")].append(math.log(m["B"] / m["C"]))
    print(line)
for k, v in sorted(logs.items()):
    print(k, "geomean %.3f" % math.exp(sum(v) / len(v)), "min %.3f max %.3f" % (math.exp(min(v)), math.exp(max(v))))
