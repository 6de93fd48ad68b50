"""perturb.py's command line: corrupt a video (or the built-in clip) with one subtype, or draw the contact sheet of
a protocol's subtypes. Here: the flags, reading the clip and its depth, writing the video or the sheet; perturb.main
corrupts (its registry's names come in as data: the machinery never imports a stage script).

    python perturb.py clip.mp4 --subtype fog --out foggy.mp4
    python perturb.py --grid sheet.png
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from machinery import cli, video
from machinery.corruption import props


OUT_SUFFIXES = (".mp4",)  # H.264 via video.write_video; GIF is not offered (it merges equal frames, rounds the fps)
GRID_FRAMES, GRID_MAX_PIXELS = 16, 256 * 28 * 28  # the --grid's sampled clip (the sheet shows 4 of its frames)
SAMPLE_FRAMES, SAMPLE_FPS = 16, 8.0  # the built-in clip

_CLI_EPILOG = (
    "--out writes a corrupted copy of INPUT: every frame, at its native size and fps (an odd width or height "
    "is padded by one pixel, repeating the edge: H.264 / yuv420p needs even sides). --frames and --max-pixels "
    "opt in to sampling as the model does (qwen-vl-utils' uniform indices, smart_resize). Memory: the clip is "
    "decoded and corrupted whole (the effects animate over all its frames), about 2 x frames x width x height "
    "x 3 bytes (a minute of 1080p at 30 fps: ~22 GB, 3x with --shuffle); a clip that does not fit in the "
    "available memory is refused before decoding. The --grid contact sheet samples a short clip (--frames, "
    f"default {GRID_FRAMES} or the clip's length if shorter, at --max-pixels, default {GRID_MAX_PIXELS}) and shows "
    "4 of its frames per row.")


ETA_FORM = "a number in [0, 1] or 'X,subtype=Y,...', e.g. '0.7,fog=0.4' (a decimal point, not a comma)"


def parse_eta(text, subtypes, default):
    """--eta's grammar (perturb.parse_eta gives the registry's `subtypes`, EFFECTS, and App. D's `default`): "X" or
    "X,subtype=Y,..." (the first bare number is the other subtypes' intensity), each in [0, 1]. A bare number
    after the first (a decimal comma, "0,7") is refused, not read as the last one. One ValueError naming the
    value and the accepted form."""
    table = {"*": default}
    try:
        for k, part in enumerate(p.strip() for p in str(text).split(",") if p.strip()):
            name, eta = _eta_part(part, k, subtypes)
            table[name] = eta
    except ValueError as e:
        raise ValueError(f"eta {text!r}: expected {ETA_FORM} ({e})") from None
    return table["*"] if len(table) == 1 else table   # (one number: that number)


def _eta_part(part, k, subtypes):
    """("*" or the subtype, its intensity) of the k-th comma-separated part."""
    name, _, value = part.rpartition("=")
    if name and name not in subtypes:
        raise ValueError(f"unknown perturbation subtype {name!r}; valid subtypes: {', '.join(subtypes)}")
    if not name and k:
        raise ValueError(f"{part!r} has no subtype=")
    eta = float(value)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"{value} is outside [0, 1]")
    return name or "*", eta


class EtaArg:
    """--eta as argparse's type= (parse_eta): its ValueError becomes argparse's one line, which names the flag."""

    def __init__(self, subtypes, default):
        self.subtypes, self.default = subtypes, default

    def __call__(self, text):
        try:
            return parse_eta(text, self.subtypes, self.default)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None


def _check_cli_args(args):
    """The flag values, before any work: one-line UserErrors."""
    for flag, value in (("--frames", args.frames), ("--max-pixels", args.max_pixels), ("--size", args.size)):
        if value is not None and value < 1:
            raise cli.UserError(f"{flag} must be a positive integer, got {value}")
    if args.out and not args.subtype:
        raise cli.UserError(f"--out {args.out} needs --subtype NAME, the perturbation to apply")
    if args.max_pixels is not None and not args.input:
        raise cli.UserError("--max-pixels resizes an INPUT video; the built-in clip's side is --size")
    if not 0.0 <= args.eta <= 1.0:   # (as PerturbSpec says it)
        raise cli.UserError(f"eta must be a number in [0, 1], got {args.eta!r}")
    if args.seed < 0:
        raise cli.UserError(f"seed must be a non-negative integer, got {args.seed!r}")


def _memory_available():
    """Bytes of memory available now (Linux's MemAvailable, else the physical memory); None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_memory(path, info, num_frames, max_pixels, copies):
    """Refuse, before decoding, a clip whose `copies` (decoded + corrupted [+ shuffled]) cannot fit, at the
    size video.read_clip decodes it for these options."""
    n, h, w = num_frames or info["frames"], info["height"], info["width"]
    if max_pixels is not None:
        try:
            h, w = video.smart_resize(h, w, max_pixels=max_pixels)
        except ValueError as e:
            raise cli.UserError(f"--max-pixels {max_pixels}: {e}") from None
    need, have = copies * n * h * w * 3, _memory_available()
    if have is not None and need > have:
        raise cli.UserError(
            f"{path}: {n} frames of {w}x{h} need about {need / 1e9:.1f} GB of memory (the clip is decoded and "
            f"corrupted whole), {have / 1e9:.1f} GB are available; sample it with --frames N and/or shrink it "
            f"with --max-pixels P, or cut it first (ffmpeg -ss START -t SECONDS)")


def _fps_text(fps):
    return f"{round(float(fps), 3)}"


def _read(path, num_frames, max_pixels):
    """video.read_clip, ffmpeg's own messages about a bad file held back (the VideoError says it)."""
    with video.held_native_stderr():
        return video.read_clip(path, num_frames, max_pixels)


def _read_for_out(args, info):
    """INPUT for --out: (frames, their indices in INPUT, fps to write, what they are in words)."""
    copies = (3 if args.shuffle else 2) + (args.depth_model != "proxy")   # (+ float16 depth: 2 of 3 bytes a pixel)
    _check_memory(args.input, info, args.frames, args.max_pixels, copies)
    frames, indices, fps = _read(args.input, args.frames, args.max_pixels)
    frames, fps, what = _describe_out(args, info, frames, fps)
    return frames, indices, fps, what


def _describe_out(args, info, frames, fps):
    """(frames, fps to write, what they are in words) of INPUT's frames read for --out."""
    name, total, T = args.input, info["frames"], len(frames)
    if args.frames is None:
        what = f"all frames of {name}"
    else:
        what = f"{T} of the {total} frames of {name}, sampled uniformly" + (" (some repeated)" if T > total else "")
    if args.max_pixels is None:
        what += ", native size"
    else:
        what += f", resized from {info['width']}x{info['height']} by smart_resize (max_pixels={args.max_pixels})"
    if not fps > 0:  # a stream without a frame rate: decord reports 0
        return frames, SAMPLE_FPS, f"{what}; {name} has no frame rate, written at {SAMPLE_FPS} fps"
    if args.frames is not None:
        what += f"; its {_fps_text(fps)} fps scaled by {T}/{total} to keep its {total / fps:.2f} s"
        fps = fps * T / total
    return frames, fps, what


def _depth(args, frames, video_id, indices, given, what):
    """(depth for perturb.apply, `what` + where it comes from), by --depth-model: auto, the clip's own (`given`: the
    built-in clip's true depth) or else the recommended model's; proxy, none (scene.depth_proxy); NAME, that
    model's (depth.py, cached)."""
    from machinery.corruption import depth as depth_model   # (torch and transformers load only with a depth model)

    name = args.depth_model or depth_model.PROXY
    if name == depth_model.PROXY:
        return None, what
    if name == depth_model.AUTO and given is not None:
        return given, f"{what}, with its true depth"
    source = depth_model.Depth(name, args.depth_cache or None).source
    return source(frames, video_id, indices), f"{what}; depth by {source.name}"


class Job:
    """A clip to corrupt with `subtypes` (--out: --subtype; --grid: the protocol's), with its depth (None: perturb's
    proxy) and what it is in words; `write` takes perturb.main's (spec, corrupted frames) of each subtype."""

    def __init__(self, args, target, frames, fps, depth, what, subtypes):
        self.args, self.target, self.frames, self.fps, self.depth = args, target, frames, fps, depth
        self.what, self.subtypes = what, subtypes

    def write(self, rendered, category_of):
        (self._write_grid if self.target.suffix == ".png" else self._write_out)(rendered, category_of)
        self.frames = self.depth = None   # (a whole --out clip is not kept while the --grid's is read)

    def _write_out(self, rendered, _):
        (spec, out), = rendered
        video.write_video(self.target, out, fps=self.fps)
        T, h, w = self.frames.shape[:3]
        eh, ew = video.even_size(h, w)
        what = self.what
        if (eh, ew) != (h, w):
            what += f"; {w}x{h} padded to {ew}x{eh}, repeating the edge: H.264 needs even sides"
        print(f"wrote {self.target}: {T} frames, {ew}x{eh}, {_fps_text(self.fps)} fps ({what}); "
              f"spec={spec.to_json()}")

    def _write_grid(self, rendered, category_of):
        rows = [self.frames] + [out for _, out in rendered]
        labels = ["clean"] + [f"{category_of[spec.subtype]}/{spec.subtype}" for spec, _ in rendered]
        cols, args = 4, self.args
        video.contact_sheet(rows, labels, self.target, num_cols=cols)
        h, w = self.frames.shape[1:3]
        print(f"wrote {self.target}: clean + {len(rows) - 1} subtypes ({args.protocol}) x "
              f"{min(cols, len(self.frames))} frames of {self.what}, {w}x{h} each; eta={args.eta}, seed={args.seed}")


def parse_args(argv, subtypes, protocols, default_eta):
    """The flags, checked before any work (one-line errors). `subtypes`: the registry's names (Table 8's and any
    registered); `protocols`: {name: its subtypes}; `default_eta`: App. D's intensity."""
    ap = cli.ArgumentParser(
        description="Corrupt a video with one of PVRBench's 12 perturbations (Table 8) or a registered "
                    "extension's, or render the contact sheet of a protocol's subtypes. "
                    "With no INPUT, a procedural street clip (with its true depth) generated by the project "
                    "is used.", epilog=_CLI_EPILOG)
    ap.add_argument("input", nargs="?", help="input video (mp4, ...); default: the built-in sample clip")
    ap.add_argument("--subtype", choices=tuple(subtypes),
                    help="perturbation subtype (Table 8, or a registered extension's)")
    ap.add_argument("--eta", type=float, default=default_eta, help="intensity in [0,1] (App. D: 0.7)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the spec (the layout and animation)")
    ap.add_argument("--shuffle", action="store_true", help="also shuffle the frames (Eq. 1-2)")
    ap.add_argument("--scene", default="auto", choices=("auto", *props.SCENES),
                    help="the clip's scene kind, which decides the occluders of static and dynamic (indoor: people, "
                         "furniture-scale edges; aerial: birds, drones, branches; street: pedestrians, vehicles, "
                         "vegetation); auto: inferred from its depth, and named in the spec printed")
    ap.add_argument("--out", help="output .mp4 for --subtype: the corrupted copy of INPUT (all frames, native "
                                  "size and fps unless --frames / --max-pixels)")
    ap.add_argument("--grid", help="output .png: the contact sheet of clean + the protocol's subtypes")
    ap.add_argument("--protocol", choices=sorted(protocols), default="pvrbench",
                    help="subtypes of the --grid: pvrbench (Table 8's 12, default) or a registered protocol")
    ap.add_argument("--frames", type=int, metavar="N",
                    help="sample N frames uniformly from INPUT, as the model does (the fps written is scaled "
                         f"to keep the clip's duration); default: all of them for --out, {GRID_FRAMES} for "
                         f"--grid; with no INPUT, the built-in clip's length ({SAMPLE_FRAMES})")
    ap.add_argument("--max-pixels", type=int, metavar="P",
                    help="resize INPUT's frames to this pixel budget, as the model does (smart_resize: sides "
                         f"multiples of 28); default: native size for --out, {GRID_MAX_PIXELS} for --grid")
    ap.add_argument("--size", type=int, default=448, help="side of the built-in sample clip")
    ap.add_argument("--depth-model", default="auto", metavar="NAME",
                    help="depth of the depth-graded effects: auto (the built-in clip's true depth; for INPUT "
                         "depth-anything/Depth-Anything-V2-Small-hf, cached: depth.py), proxy (the depth proxy, no "
                         "model), or a transformers depth-estimation model's hub id or folder")
    ap.add_argument("--depth-cache", default="", metavar="DIR",
                    help="where --depth-model's maps are cached (default $XDG_CACHE_HOME/rova/depth, i.e. "
                         "~/.cache/rova/depth)")
    cli.add_debug_flag(ap)
    args = ap.parse_args(argv)
    if not args.grid and not (args.subtype and args.out):
        ap.error("give --grid OUT.png, or --subtype NAME --out OUT.mp4")
    _check_cli_args(args)
    args.protocol_subtypes = list(protocols[args.protocol])
    return args


def jobs(args):
    """The clips to corrupt, as Jobs: --out's, then --grid's; of INPUT, or of the built-in clip."""
    out = cli.out_file(args.out, OUT_SUFFIXES, "--out") if args.out else None
    grid = cli.out_file(args.grid, (".png",), "--grid") if args.grid else None
    from machinery.corruption import depth as depth_model   # (torch and transformers load only to run a depth model)

    depth_model.check_source(args.depth_model, args.depth_cache, needs_model=False)   # one line now (auto: below)
    yield from (_on_input(args, out, grid) if args.input else _on_sample(args, out, grid))


def _on_input(args, out, grid):
    """--out and/or --grid of INPUT (depth: --depth-model's: by default the recommended model's)."""
    with video.held_native_stderr():
        info = video.probe(args.input)  # a VideoError names the file
    if out is not None and out.resolve() == Path(args.input).resolve():
        raise cli.UserError(f"--out {args.out} is the input video; give another file name")
    from machinery.corruption import depth as depth_model

    depth_model.check_source(args.depth_model, args.depth_cache)   # auto: a real video needs the model
    video_id = str(Path(args.input).resolve())
    if out is not None:
        frames, indices, fps, what = _read_for_out(args, info)
        yield Job(args, out, frames, fps, *_depth(args, frames, video_id, indices, None, what), [args.subtype])
        del frames
    if grid is not None:
        n, mp = args.frames or min(GRID_FRAMES, info["frames"]), args.max_pixels or GRID_MAX_PIXELS
        frames, indices, _ = _read(args.input, n, mp)
        what = f"{n} sampled uniformly from {args.input} (of its {info['frames']})"
        yield Job(args, grid, frames, None, *_depth(args, frames, video_id, indices, None, what),
                  args.protocol_subtypes)


def _on_sample(args, out, grid):
    """--out and/or --grid of the built-in clip (depth: its true depth, or --depth-model's)."""
    from machinery.datasets import synthetic  # the built-in clip (imported here: the engine needs not its imports)

    frames, true_depth = synthetic.sample_clip(args.frames or SAMPLE_FRAMES, args.size, args.size)
    video_id, indices = f"perturb-sample-clip/{args.size}", range(len(frames))
    depth, what = _depth(args, frames, video_id, indices, true_depth, "the built-in sample clip")
    if out is not None:
        yield Job(args, out, frames, SAMPLE_FPS, depth, what, [args.subtype])
    if grid is not None:
        yield Job(args, grid, frames, None, depth, f"{what} ({len(frames)} frames)", args.protocol_subtypes)
