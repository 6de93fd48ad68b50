"""The dynamic occluders of perturb.py's `dynamic` subtype, painted procedurally: a walker with a planted-foot
gait and a car, each part a rounded body shaded by one light in the scene's exposure, over a soft contact
shadow, out of focus by its nearness and motion-blurred; where on the ground plane an actor stands, and its Layer."""
from __future__ import annotations

import math

import cv2
import numpy as np

from machinery.corruption import kernels, scene


HALF_TURN_CS = [(math.cos(a), math.sin(a)) for a in np.linspace(-np.pi / 2, np.pi / 2, 7)]  # a capsule's end


class Paint:
    """A sprite painted part by part, each part a rounded body shaded under the light and laid over the parts
    before it: img float32 [h,w,3] (0-255), alpha float32 [h,w]. Coordinates are in units of `unit` px (the
    object's height) from `origin` px."""

    def __init__(self, h, w, unit, origin, light):
        self.img, self.alpha = np.zeros((h, w, 3), np.float32), np.zeros((h, w), np.float32)
        self.unit, self.origin, self.light = unit, np.asarray(origin, np.float64), light
        self.canvas = np.zeros((h, w, 4), np.uint8)  # the part being drawn: colour and coverage

    def _pt(self, p):  # units -> fixed point (2 fractional bits)
        return np.rint((self.origin + self.unit * np.asarray(p, np.float64)) * 4).astype(np.int32)

    @staticmethod
    def rgba(colour):  # (an rgba tuple already made is passed through)
        if isinstance(colour, tuple) and len(colour) == 4:
            return colour
        return tuple(min(255, max(0, int(v))) for v in colour) + (255,)

    def poly(self, pts, colour):
        cv2.fillPoly(self.canvas, [self._pt(pts)], self.rgba(colour), cv2.LINE_AA, shift=2)

    def disc(self, c0, r, colour):
        cv2.circle(self.canvas, tuple(self._pt(c0).tolist()), max(1, int(r * self.unit * 4)), self.rgba(colour), -1,
                   cv2.LINE_AA, shift=2)

    def ellipse(self, c0, axes, colour, angle=0.0):
        ax = tuple(max(1, int(a * self.unit * 4)) for a in axes)
        cv2.ellipse(self.canvas, tuple(self._pt(c0).tolist()), ax, angle, 0, 360, self.rgba(colour), -1,
                    cv2.LINE_AA, 2)

    def capsule(self, a, b, ra, rb, colour):
        """A tapered limb from a (radius ra) to b (radius rb), in units: one outline, two half-discs joined (in
        plain floats: 14 points, where numpy's per-call cost would dominate)."""
        ax, ay, bx, by = float(a[0]), float(a[1]), float(b[0]), float(b[1])
        n = math.hypot(bx - ax, by - ay)
        c0, s0 = ((bx - ax) / n, (by - ay) / n) if n > 0 else (1.0, 0.0)  # the axis; turned by HALF_TURN_CS
        turn = [(c0 * c - s0 * s, s0 * c + c0 * s) for c, s in HALF_TURN_CS]
        self.poly([(bx + rb * x, by + rb * y) for x, y in turn] + [(ax - ra * x, ay - ra * y) for x, y in turn],
                  colour)

    def part(self, roundness, dim=1.0):
        """Shade what was drawn since the last part as one body (`roundness` in units) and lay it on top."""
        x, y, w, h = cv2.boundingRect(np.ascontiguousarray(self.canvas[..., 3]))
        if w == 0:
            return
        roi = (slice(y, y + h), slice(x, x + w))  # only where it was drawn (the blur is zero-padded)
        part, img = self.canvas[roi], self.img[roi]
        a = part[..., 3].astype(np.float32)
        shade = kernels.emboss(a, roundness * self.unit, self.light) * np.float32(dim)
        a *= np.float32(1 / 255)
        img += a[..., None] * (part[..., :3] * shade[..., None] - img)
        np.maximum(self.alpha[roi], a, out=self.alpha[roi])
        part[:] = 0


LEG, STEP = 0.225, 0.34  # thigh = shin length, step length: fractions of the walker's height


def knee_joint(hip, ankle):
    """Two-bone IK: the knee of a leg from hip to ankle (bones LEG), bent forward (+x); the ankle is pulled
    in when out of reach."""
    d = ankle - hip
    n = float(np.hypot(*d))
    if n > 2 * LEG * 0.999:
        d, n = d * (2 * LEG * 0.999 / n), 2 * LEG * 0.999
    return hip + d / 2 + np.array([d[1], -d[0]]) / max(n, 1e-6) * math.sqrt(LEG ** 2 - (n / 2) ** 2), hip + d


def gait(phase):
    """Joints of a walker at gait phase `phase` (2 pi per stride of two steps), in units of its height: x
    forward from the hip, y down from the top of the head. Each foot is planted for half the stride (it moves
    back under the hip exactly as fast as the body advances), then swung forward and lifted; the hip vaults
    over the planted foot; knees bend forward; each arm swings against the leg on its side.
    Returns {"hip", "knee", "ankle" (near, far), "elbow", "wrist" (near, far), "dy" (the body's bob)}."""
    feet = []
    for leg in (0, 1):  # near, far: half a stride apart
        u = (phase + np.pi * leg) % (2 * np.pi)
        if u < np.pi:
            feet.append((STEP / 2 - STEP * u / np.pi, 0.0))
        else:
            s = (u - np.pi) / np.pi
            feet.append((-STEP / 2 + STEP * (1 - math.cos(np.pi * s)) / 2, 0.06 * math.sin(np.pi * s)))
    planted = min(feet, key=lambda f: f[1])[0]
    reach = 2 * LEG * 0.99
    dy = reach - math.sqrt(reach ** 2 - planted ** 2)  # the hip vaults: lowest with the feet apart
    hip = np.array([0.0, 0.965 - reach + dy])
    j = {"hip": hip, "dy": dy - 0.015, "knee": [], "ankle": [], "elbow": [], "wrist": []}
    shoulder = np.array([0.02, 0.195 + j["dy"]])
    for x, lift in feet:
        knee, ankle = knee_joint(hip, np.array([x, 0.965 - lift]))
        theta = -1.5 * x  # the arm on this side swings back as the leg goes forward
        phi = theta + 0.2 + 0.6 * max(theta, 0.0)  # the elbow bends more in the forward swing
        elbow = shoulder + 0.17 * np.array([math.sin(theta), math.cos(theta)])
        j["knee"].append(knee)
        j["ankle"].append(ankle)
        j["elbow"].append(elbow)
        j["wrist"].append(elbow + 0.145 * np.array([math.sin(phi), math.cos(phi)]))
    j["shoulder"] = shoulder
    return j


TORSO = np.array([[-0.08, 0.18], [0.0, 0.165], [0.07, 0.195], [0.085, 0.27], [0.075, 0.38], [0.08, 0.46],
                   [0.085, 0.535], [-0.08, 0.535], [-0.07, 0.44], [-0.06, 0.37], [-0.085, 0.27]])  # jacket


PELVIS = np.array([[0.075, 0.47], [0.07, 0.56], [-0.075, 0.56], [-0.07, 0.47]])


def paint_walker(paint, phase, look):
    """A walking adult in profile, facing +x, head 1/7.4 of the height: far arm and leg (in the body's own
    shadow), near leg, torso and head, near arm; each limb a tapered, shaded capsule."""
    j = gait(phase)
    jacket, trousers, skin, hair, shoes = (look[k] for k in ("jacket", "trousers", "skin", "hair", "shoes"))
    sleeve = skin if look["short_sleeves"] else jacket

    def arm(i):
        paint.capsule(j["shoulder"], j["elbow"][i], 0.034, 0.027, jacket)
        paint.capsule(j["elbow"][i], j["wrist"][i], 0.026, 0.02, sleeve)
        paint.disc(j["wrist"][i] + (j["wrist"][i] - j["elbow"][i]) * 0.2, 0.022, skin)

    def leg(i):
        paint.capsule(j["hip"] + [0.0, 0.01], j["knee"][i], 0.05, 0.037, trousers)
        paint.capsule(j["knee"][i], j["ankle"][i], 0.036, 0.027, trousers)
        paint.capsule(j["ankle"][i] + [-0.025, 0.012], j["ankle"][i] + [0.1, 0.022], 0.024, 0.018, shoes)

    arm(1)
    leg(1)
    paint.part(0.035, dim=0.58)
    leg(0)
    paint.poly(PELVIS + [0, j["dy"]], trousers)
    paint.part(0.04)
    lean = np.array([0.0, j["dy"]])
    paint.poly(TORSO + lean, jacket)
    paint.capsule([0.012, 0.125 + j["dy"]], [0.0, 0.19 + j["dy"]], 0.027, 0.03, skin)  # neck
    paint.ellipse([0.012, 0.068 + j["dy"]], (0.06, 0.068), hair)  # the head, its hair at the back and top
    paint.ellipse([0.03, 0.082 + j["dy"]], (0.047, 0.056), skin, angle=-10)
    paint.poly([[0.07, 0.065 + j["dy"]], [0.088, 0.09 + j["dy"]], [0.066, 0.095 + j["dy"]]], skin)  # nose
    paint.part(0.05)
    arm(0)
    paint.part(0.03)


CAR = np.array([[0.02, 0.52], [0.07, 0.4], [0.5, 0.37], [0.72, 0.08], [1.5, 0.06], [1.9, 0.36], [2.42, 0.42],
                 [2.57, 0.5], [2.58, 0.72], [2.5, 0.84], [0.06, 0.84], [0.0, 0.72]])  # side view, front at +x


GLASS = np.array([[0.62, 0.36], [0.8, 0.13], [1.46, 0.12], [1.76, 0.36]])


WHEELS = (0.55, 2.02)  # axle x, in car heights


def paint_car(paint, look):
    """A car in side view, facing +x, without its wheels: a rounded body lit from above, dark wheel arches,
    glass reflecting the sky (light at the top), door gaps, head- and tail-lights."""
    body = look["paint"]
    paint.poly(CAR, body)
    paint.poly([[0.01, 0.62], [2.58, 0.62], [2.58, 0.72], [2.5, 0.84], [0.06, 0.84], [0.0, 0.72]],
               np.multiply(body, 0.72))  # the lower panels face the ground: darker
    paint.poly([[0.08, 0.395], [2.3, 0.41], [2.3, 0.425], [0.08, 0.41]], np.minimum(np.multiply(body, 1.3) + 25, 255))
    for x in WHEELS:
        paint.disc([x, 0.8], 0.235, np.multiply(body, 0.25))  # the arch's shadow inside the body
    paint.part(0.14)
    glass = Paint(*paint.img.shape[:2], paint.unit, paint.origin, paint.light)
    glass.poly(GLASS, (70, 82, 96))
    glass.part(0.02)
    ramp = np.linspace(1.5, 0.6, len(paint.img), dtype=np.float32)[:, None, None]
    paint.img += glass.alpha[..., None] * (glass.img * ramp - paint.img)
    for x in (1.17, 1.8):  # door gaps
        paint.poly([[x, 0.38], [x + 0.012, 0.38], [x + 0.012, 0.8], [x, 0.8]], np.multiply(body, 0.55))
    paint.ellipse([2.5, 0.5], (0.06, 0.035), (235, 230, 205))
    paint.ellipse([0.06, 0.47], (0.03, 0.045), (170, 22, 22))
    paint.part(0.01)


def paint_wheels(paint):
    """Tyres and dished rims with a hub (a wheel rolling this fast shows no spokes on video: motion blur)."""
    for x in WHEELS:
        paint.disc([x, 0.8], 0.2, (24, 24, 26))
        paint.disc([x, 0.8], 0.125, (150, 152, 158))
        paint.disc([x, 0.8], 0.09, (105, 107, 112))
        paint.disc([x, 0.8], 0.035, (135, 137, 142))
    paint.part(0.05)


def actor_look(rng, walker):
    """Colours and the light direction of one actor, from its seeded stream."""
    side = 1.0 if rng.random() < 0.5 else -1.0
    light = np.array([side * rng.uniform(0.3, 0.8), -0.8, 0.6])
    look = {"light": light / np.linalg.norm(light)}
    pick = lambda options: np.asarray(options[int(rng.integers(len(options)))], np.float64)  # noqa: E731
    if not walker:
        look["paint"] = np.clip(pick([(215, 215, 212), (165, 168, 172), (28, 29, 32), (95, 97, 100), (150, 22, 26),
                                      (30, 55, 125), (30, 60, 45), (170, 150, 115)]) * rng.uniform(0.9, 1.1, 3), 0, 255)
        return look
    import colorsys

    hsv = rng.uniform(0, 1), rng.uniform(0.15, 0.7), rng.uniform(0.2, 0.8)  # any hue, muted to vivid, dark to light
    look["jacket"] = 255 * np.array(colorsys.hsv_to_rgb(*hsv))
    look["trousers"] = np.clip(pick([(50, 65, 100), (30, 30, 34), (140, 125, 95), (90, 90, 95), (80, 60, 45)])
                               * rng.uniform(0.85, 1.15), 0, 255)
    look["skin"] = (235, 195, 170) + rng.uniform(0, 1) * np.subtract((95, 62, 45), (235, 195, 170))
    look["hair"] = pick([(25, 20, 18), (60, 40, 25), (120, 90, 50), (190, 160, 110), (140, 140, 140)])
    look["shoes"] = pick([(30, 28, 28), (30, 28, 28), (70, 45, 30), (210, 210, 205)])
    look["short_sleeves"] = bool(rng.random() < 0.3)
    return look


def scene_light(small):
    """What puts an actor in the scene's light, from the middle frame: a per-channel gain (its exposure and
    colour cast: a person at dusk is as dim and as blue as the dusk around them) and a chroma factor (as
    colourful as the scene: grey in a black-and-white clip)."""
    f = small[len(small) // 3:].reshape(-1, 3).astype(np.float32) / 255  # the light down where it stands
    m = f.mean(0)
    lum = max(float(m.mean()), 1e-3)
    gain = np.clip((lum / 0.45) ** 0.8, 0.25, 1.25) * np.clip((m / lum) ** 0.4, 0.8, 1.25)
    return gain.astype(np.float32), np.float32(np.clip((f.max(1) - f.min(1)).mean() / 0.12, 0, 1))


CLOTHES = ("jacket", "trousers", "skin", "hair", "shoes")


def lit(img, light):
    """Colours [..., 3] in the scene's light (scene_light): linear in them."""
    gain, chroma = light
    grey = img.mean(-1, keepdims=True)
    return (grey + chroma * (img - grey)) * gain


def actor_frame(walker, unit, phase, look, face, cache):
    """One frame of an actor `unit` px tall: (img, alpha, contact shadow) float32 maps and the canvas x (px)
    of its centre; the ground contact is the canvas row `unit`. Faces +x, mirrored when face < 0. `cache`
    keeps what does not change between frames (the shadow)."""
    if walker:
        h, w, cx, origin = int(math.ceil(1.05 * unit)), int(math.ceil(0.9 * unit)), 0.45 * unit, 0.45 * unit
    else:
        h, w, cx, origin = int(math.ceil(1.06 * unit)), int(math.ceil(2.75 * unit)), 1.37 * unit, 0.08 * unit
    light = look["light"] * [face, 1, 1]
    paint = Paint(h, w, unit, (origin, 0), light)
    if walker:
        paint_walker(paint, phase, look)
    else:
        paint_car(paint, look)
        paint_wheels(paint)
    if "shadow" not in cache:  # on the ground under it, offset away from the light
        half, thick, dark = (0.25, 0.03, 0.6) if walker else (1.3, 0.06, 0.75)
        shadow = np.zeros((h, w), np.uint8)
        cv2.ellipse(shadow, (int((cx - light[0] * 0.08 * unit) * 4), int(0.995 * unit * 4)),
                    (int(half * unit * 4), max(1, int(thick * unit * 4))), 0, 0, 360, 255, -1, cv2.LINE_AA, 2)
        cache["shadow"] = cv2.GaussianBlur(shadow.astype(np.float32) * np.float32(dark / 255), (0, 0),
                                           max(0.7, 0.02 * unit))
    img, alpha, shadow = paint.img, paint.alpha, cache["shadow"]
    img *= np.linspace(1.08, 0.85, h, dtype=np.float32)[:, None, None]  # lit from above: darker toward the ground
    if face < 0:
        img, alpha, shadow, cx = img[:, ::-1], alpha[:, ::-1], shadow[:, ::-1], w - cx
    return img, alpha, shadow, cx


def defocus(img, alpha, shadow, sigma, streak, k, cache):
    """The actor out of focus (sigma px) and motion-blurred (a horizontal streak px), cropped to where it
    weighs anything and upscaled k times: the Layer's weight (the actor over its darkened contact shadow),
    its effect (premultiplied colour over that weight: the blur leaves no dark fringe), and the crop's
    offset (x, y) from the canvas's corner in upscaled px (it reaches past the canvas by the blur). The
    shadow is the same in every frame: blurred once, in `cache`."""
    sx = math.sqrt(sigma ** 2 + streak ** 2 / 12)
    px, py = int(math.ceil(3 * sx)), int(math.ceil(3 * sigma))  # room for the blur around the canvas
    h, w = alpha.shape
    blur = lambda m: cv2.GaussianBlur(m, (0, 0), sigmaX=sx, sigmaY=sigma)  # noqa: E731
    stack = np.zeros((h + 2 * py, w + 2 * px, 4), np.float32)
    inner = stack[py:py + h, px:px + w]
    inner[..., :3] = img * alpha[..., None]
    inner[..., 3] = alpha
    stack = blur(stack)
    if "blurred shadow" not in cache:
        cache["blurred shadow"] = np.clip(blur(cv2.copyMakeBorder(shadow, py, py, px, px, cv2.BORDER_CONSTANT)), 0, 1)
    a, s = np.clip(stack[..., 3], 0, 1), cache["blurred shadow"]
    weight = a + (1 - a) * s
    x, y, cw, ch = cv2.boundingRect((weight > 1e-3).view(np.uint8))
    if cw == 0:
        return None, None, (0, 0)
    weight, stack = weight[y:y + ch, x:x + cw], stack[y:y + ch, x:x + cw]
    effect = np.clip(stack[..., :3] / np.maximum(weight, 1e-3)[..., None] + 0.5, 0, 255).astype(np.uint8)
    size = (max(1, int(round(cw * k))), max(1, int(round(ch * k))))
    return (cv2.resize(weight, size, interpolation=cv2.INTER_LINEAR),
            cv2.resize(effect, size, interpolation=cv2.INTER_LINEAR),
            (int(round((x - px) * k)), int(round((y - py) * k))))


def ground_contact(ctx, walker):
    """(ground contact row, height) of a dynamic actor in px, from its nearness. Where the depth used shows
    ground (ctx.ground), on the ground plane seen by a camera 1.5 m high (a 1.75 m walker's head just above the
    horizon, a 1.45 m car's roof just below it). Where it does not (a close-up, a wall, a view from above), the
    actor passes just in front of the camera with its contact below the frame, cut by the lower edge, its size
    set by its nearness: it never stands on a row where nothing says there is ground."""
    H, n = ctx.H, ctx.p["nearness"]
    if ctx.ground < 0.5:
        height = H * ((0.8 + 0.9 * n) if walker else (0.35 + 0.35 * n))
        return H + (0.2 if walker else 0.15) * height, height   # below the edge by more than the lane's 0.05 H
    hor = float(np.clip(ctx.horizon, 0.3, 0.6)) * H
    if walker:  # 1 / distance: 4 m away at nearness 0.45, 1.5 m at 1, a frame high at ~2.3 m
        base = hor + (H - hor) * 2.5 / (6 - 4.5 * n)
    else:  # a car's roof stays at the horizon: its size grows more slowly
        base = hor + (H - hor) * (0.35 + 0.6 * n)
    return base, (base - hor) * (1.75 / 1.5 if walker else 1.45 / 1.5)   # a pinhole's: what its distance allows


NEARER = 0.06  # how much nearer than an actor's contact (normalised depth) the scene must be to hide it


def behind_nearer(ctx, layer, t, contact):
    """`layer` (an actor standing on the ground at row `contact` of frame t) hidden where the scene is nearer than
    its contact by more than NEARER (scene.fade_behind's ramp): it walks behind a pillar, never through it. Its
    own depth is the median of the depth used along its contact row (a flat ground's row is one distance), or
    along the lowest row when its feet are below the frame (it is nearer than any ground in view). Where no
    ground is seen it passes just in front of the camera, in front of everything."""
    if layer.roi is None or ctx.ground < 0.5:
        return layer
    d = ctx.depth(t)
    y0, y1, x0, x1 = layer.roi
    row = int(np.clip(contact, 0, ctx.H - 1))
    own = ctx.per_map(("contact", row), t, lambda t: float(np.median(ctx.depth(t)[row])))
    front = np.multiply(scene.fade_behind(d[y0:y1, x0:x1], own - NEARER), np.float32(1 / 255), dtype=np.float32)
    front *= layer.weight
    return scene.Layer(front, layer.effect, layer.roi)


def placed(weight, effect, top, left, H, W):
    """The scene.Layer of an actor image whose corner is at (top, left) px, cropped to the frame."""
    if weight is None:
        return scene.UNCHANGED
    y0, y1 = max(top, 0), min(top + weight.shape[0], H)
    x0, x1 = max(left, 0), min(left + weight.shape[1], W)
    if y0 >= y1 or x0 >= x1:
        return scene.UNCHANGED
    sl = (slice(y0 - top, y1 - top), slice(x0 - left, x1 - left))
    return scene.Layer(np.ascontiguousarray(weight[sl]), np.ascontiguousarray(effect[sl]), (y0, y1, x0, x1))
