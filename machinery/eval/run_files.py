"""The files of an eval_pvrbench.py run: its run hash (the settings that change a generation, run_config), the
latest results file of each run (latest_per_config, latest_results), the files written (write_results) and their
per-task bar charts (per_task.png, compare_per_task.png)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from machinery.corruption import depth as depths
from machinery.datasets import answers
from machinery.eval.evaluation import EvalSettings, video_format, write_jsonl


def _fingerprint(path):
    """Names, sizes and mtimes of a file or a folder's files: a rebuilt checkpoint or data file is a new run."""
    p = Path(path)
    files = sorted(p.iterdir()) if p.is_dir() else [p] if p.exists() else []
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.is_file()]


def run_config(settings: EvalSettings, target, paths, roots, subtypes, render, run_key=None):
    """What the run hash covers: everything that changes a generation (not --limit or --judge) of `target`
    (eval_pvrbench.Target); `render`: the corruption engine's version; `run_key`: an extension's settings."""
    spec, scheme, path, adapter = target.spec, target.scheme, target.path, settings.adapter
    return dict(model=spec, model_fp=[] if scheme == "openai" else _fingerprint(path), adapter=adapter,
                adapter_fp=_fingerprint(adapter) if adapter else None, base_url=settings.base_url,
                sources={n: [str(p), _fingerprint(Path(p) / "eval.jsonl" if n == "synthetic" else p),
                             roots.get(n, roots.get(None))] for n, p in paths.items()},
                subtypes=subtypes, assign=settings.assign, frames=settings.frames, max_pixels=settings.max_pixels,
                fps=settings.fps, eta=settings.eta, style=settings.style, max_new_tokens=settings.max_new_tokens,
                render=render, **({"scoring": settings.scoring} if settings.scoring != answers.SCORINGS[0] else {}),
                **({"etas": list(settings.etas)} if settings.etas else {}),
                **(run_key or {}), depth=depths.Depth(settings.depth_model).key(),
                **({"video_format": video_format(settings.video_format, settings.base_url)}
                   if scheme == "openai" else {}))


def latest_per_config(paths):
    """{(model, run hash, judge): (path, results)} of the newest <timestamp>_results.json of each model and
    configuration (what the same command run again shares)."""
    latest = {}
    for p in sorted(paths, key=lambda p: Path(p).name):  # timestamps first: oldest to newest
        res = json.loads(Path(p).read_text())
        latest[res["config"]["model_name"], res["config"].get("run_hash"), res["config"].get("judge")] = (p, res)
    return latest


def latest_results(model_dir, run_hash, judge):
    """(path, results) of the newest results of this configuration in model_dir, or None."""
    return next((v for (_, h, j), v in latest_per_config(Path(model_dir).glob("*_results.json")).items()
                 if (h, j) == (run_hash, judge)), None)


def write_results(out, flat, model_dir, run_dir, ts, table_md):
    """<ts>_manifest.jsonl, <ts>_samples_pvrbench_<source>.jsonl (lmms-eval's layout), <ts>_results.json and
    table.md (the pictures: eval_pvrbench.draw_charts)."""
    shutil.copyfile(run_dir / "manifest.jsonl", model_dir / f"{ts}_manifest.jsonl")
    for src, rs in flat.items():   # lmms-eval's: resps [[text]], filtered_resps [answer]
        write_jsonl(model_dir / f"{ts}_samples_pvrbench_{src}.jsonl",
                    [dict(r, resps=[[r["response"]]], filtered_resps=[r["filtered_resps"]]) for r in rs])
    (model_dir / f"{ts}_results.json").write_text(json.dumps(out, indent=1, ensure_ascii=False))
    (model_dir / "table.md").write_text(table_md)


COLOURS = [((120, 170, 220), (30, 90, 160)), ((240, 170, 120), (200, 90, 20)), ((150, 210, 150), (40, 140, 60)),
           ((200, 160, 210), (120, 60, 150)), ((200, 200, 200), (90, 90, 90))]


def chart(path, results_list, labels):
    """per_task.png / compare.png: per task, the clean and the perturbed (pooled) score of each result."""
    tasks = list(dict.fromkeys((src, t) for res in results_list for src, b in res["results"]["sources"].items()
                               for t in b["per_task"]["clean"] | b["per_task"]["perturbed"]))
    series = []
    for i, (res, label) in enumerate(zip(results_list, labels)):
        light, dark = COLOURS[i % len(COLOURS)]
        pt = res["results"]["sources"]
        for kind, rgb in (("clean", light), ("perturbed", dark)):
            series.append((f"{label} {kind}" if len(labels) > 1 else kind, rgb,
                           [pt.get(s, {}).get("per_task", {}).get(kind, {}).get(t) for s, t in tasks]))
    names = [f"{s}/{t}" if len({s for s, _ in tasks}) > 1 else t for s, t in tasks]
    return bar_chart(path, names, series, "PVRBench per task: clean vs perturbed")


def bar_chart(path, groups, series, title):
    """A grouped bar chart drawn with Pillow: one group per task, one bar per (label, rgb, values) series;
    the groups share the plot's whole width."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=13)
    left, top, plot_h, right = 50, 60, 300, 10
    legend = sum(24 + int(font.getlength(label)) for label, _, _ in series)
    width = max(left + len(groups) * (len(series) * 14 + 18) + right, left + legend + right, 420)
    group_w = (width - left - right) / max(len(groups), 1)
    bw = min(40.0, 0.8 * group_w / max(len(series), 1))  # bars take 80% of a group, at most 40 px each
    label_h = 10 + max([int(font.getlength(g)) for g in groups] or [0])
    img = Image.new("RGB", (width, top + plot_h + label_h), "white")
    d = ImageDraw.Draw(img)
    d.text((left, 8), title, fill="black", font=font)
    x = left
    for label, rgb, _ in series:
        d.rectangle([x, 30, x + 10, 40], fill=rgb)
        d.text((x + 14, 28), label, fill="black", font=font)
        x += 24 + int(font.getlength(label))
    for k in range(5):
        y = top + plot_h - k * plot_h / 4
        d.line([left, y, width - right, y], fill=(220, 220, 220))
        d.text((8, y - 7), f"{k / 4:.2f}", fill="black", font=font)
    for g, name in enumerate(groups):
        x0 = left + g * group_w + (group_w - bw * len(series)) / 2
        for s, (_, rgb, values) in enumerate(series):
            if values[g] is not None:
                d.rectangle([x0 + s * bw, top + plot_h * (1 - min(max(values[g], 0), 1)), x0 + (s + 1) * bw - 2,
                             top + plot_h], fill=rgb)
        tw = int(font.getlength(name)) + 4
        txt = Image.new("RGB", (tw, 16), "white")
        ImageDraw.Draw(txt).text((2, 0), name, fill="black", font=font)
        img.paste(txt.rotate(90, expand=True), (int(x0 + len(series) * bw / 2 - 8), top + plot_h + 6))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return str(path)
