"""How LocalJudge's DEFAULT_THRESHOLDS (judge.py) were derived: MiniLM cosine similarities of 34 labelled
reasoning pairs (Fig. 9's three tiers), the tier thresholds that classify them best, the accuracy of the
defaults around that optimum, and a leave-one-out check of how well any thresholds generalise.

    python experiments/calibrate_judge.py

Needs the offline MiniLM package (judge.MINILM_PACKAGE); a few seconds on a CPU. tests/test_judge.py
checks the defaults against these pairs and :func:`calibrate_thresholds`.
"""
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (reference, candidate, tier) in the style of this project's traces (the synthetic embodied benchmark,
# VSI-Bench, UrbanVideo-Bench). Tiers as Fig. 9: 1.0 paraphrase (minor omissions allowed), 0.5
# generally consistent with unsupported additions or missing key steps, 0.0 contradiction or
# hallucinated core facts. Written before measuring; LocalJudge's thresholds were chosen on them.
TURN_L = ("The ground pattern and the objects slide to the right, so the camera is rotating to the left. "
          "The agent is turning left.")
COUNT = ("I count the red objects across all frames, each one once. There is a red cube on the left and a "
         "red pillar in the middle, so there are 2 red objects.")
ORDER = ("The blue slab appears first in frame 2, then the green cube enters in frame 6, and the yellow "
         "pillar becomes visible last in frame 11.")
DIST = ("The orange block is about 1 metre from the purple cube, while the other objects are more than "
        "3 metres away, so the orange block is the closest.")
SOFA = ("The sofa is against the back wall and the TV is on the opposite wall. Using the door, about 2 "
        "metres wide, as a scale, the sofa is roughly 4 metres from the TV.")
DRONE = ("The drone is flying toward the tall glass building. The target red sign is on its right side, "
         "so the drone should turn right and descend.")
FOG = ("Fog hides the distant objects, but the near ground pattern still shifts to the left between "
       "frames, so the camera rotates to the right. The agent turns right.")
AHEAD = ("The objects grow and move outward from the centre without sliding sideways, so the camera "
         "moves straight ahead.")
ROOM = ("The room contains a bed, a desk and a wardrobe. Its length is about 5 metres and its width about "
        "4 metres, so the area is about 20 square metres.")
KITCHEN = ("First the chair appears at the start of the video, then the lamp on the table, and finally the "
           "refrigerator near the end when the camera enters the kitchen.")

CALIBRATION_PAIRS = [
    # 1.0: the same facts and steps, paraphrased
    (TURN_L, ("Objects and the checkerboard ground move rightward across the frames, which means the camera "
              "turns to the left; the agent turns left."), 1.0),
    (COUNT, ("Counting each red object once over the whole video: a red cube at the left and a red pillar near "
             "the centre. That makes two red objects."), 1.0),
    (ORDER, ("First the blue slab shows up (frame 2), next the green cube (frame 6), and finally the yellow "
             "pillar around frame 11."), 1.0),
    (DIST, ("Compared with the others, which are over 3 m away, the orange block sits roughly a metre from the "
            "purple cube, making it the nearest."), 1.0),
    (SOFA, ("The sofa stands by the back wall, facing the TV on the other wall. Taking the 2 m wide door as a "
            "reference, the distance between the sofa and the TV is about 4 m."), 1.0),
    (DRONE, ("Heading towards the glass tower, the drone sees the red sign to the right of the building; it "
             "needs to turn right and lower its altitude."), 1.0),
    (FOG, ("Even though fog covers the far part of the scene, the nearby ground moves left from frame to "
           "frame, so the agent is turning right."), 1.0),
    (AHEAD, ("Nothing slides sideways; the objects just get bigger and spread out from the middle of the view, "
             "so the agent is going straight ahead."), 1.0),
    (ROOM, ("With a bed, a desk and a wardrobe inside, the room measures roughly 5 m by 4 m, giving an area of "
            "around 20 square metres."), 1.0),
    (KITCHEN, ("The chair is seen first, followed by the lamp, and the refrigerator appears last once the "
               "camera reaches the kitchen."), 1.0),
    # 0.5: generally consistent, but unsupported additions or missing key steps
    (TURN_L, ("The objects slide to the right. A person is also walking behind the red pillar and the light "
              "gets darker, so the agent turns left."), 0.5),
    (COUNT, "There are 2 red objects.", 0.5),
    (ORDER, ("The blue slab appears first. The rain makes the scene hard to see and a car passes in front of "
             "the camera. The yellow pillar is last."), 0.5),
    (DIST, ("The orange block is the closest because it has the same size as the purple cube and both stand "
            "near the wall."), 0.5),
    (SOFA, ("The sofa is against the back wall. It is roughly 4 metres from the TV, judging by the number of "
            "floor tiles between them and the height of the ceiling lamp."), 0.5),
    (DRONE, ("The drone flies toward the glass building and should turn right and descend; a second drone and "
             "a helicopter are also circling near the roof."), 0.5),
    (FOG, "Fog covers the scene, so I cannot see much; the agent probably turns right.", 0.5),
    (AHEAD, "The objects get bigger, and a car on the road speeds past a bus stop, so the agent goes ahead.", 0.5),
    (ROOM, "The room looks like a bedroom, so it is probably about 20 square metres.", 0.5),
    (KITCHEN, ("The chair appears first and the refrigerator last; a dog runs through the hallway in the middle "
               "of the video."), 0.5),
    # 0.0: contradicts the reference (minimal edits: the hard case for an encoder) ...
    (TURN_L, ("The ground pattern and the objects slide to the left, so the camera is rotating to the right. "
              "The agent is turning right."), 0.0),
    (COUNT, ("I count the red objects across all frames. There is only a red cube on the left; the pillar in "
             "the middle is orange, so there is 1 red object."), 0.0),
    (ORDER, ("The yellow pillar appears first in frame 2, then the green cube enters in frame 6, and the blue "
             "slab becomes visible last in frame 11."), 0.0),
    (DIST, ("The orange block is more than 3 metres from the purple cube, while the green pillar stands right "
            "next to it, so the green pillar is the closest."), 0.0),
    (SOFA, ("There is no TV in the room; the sofa faces a window, and the only screen is a laptop on the desk "
            "about 1 metre away."), 0.0),
    (DRONE, ("The drone is flying away from the glass building. The red sign is on its left side, so the drone "
             "should turn left and climb."), 0.0),
    (FOG, ("The fog makes everything static: the near ground does not move at all, so the agent is standing "
           "still."), 0.0),
    (AHEAD, ("The objects slide quickly to the left across the frames, so the camera is turning right rather "
             "than moving ahead."), 0.0),
    (ROOM, ("The room is a large kitchen of about 10 by 8 metres with an island and a dining table, roughly 80 "
            "square metres."), 0.0),
    (KITCHEN, ("The refrigerator is visible from the first frame, the chair appears last, and there is no lamp "
               "in the video."), 0.0),
    # ... or describes a different scene altogether (heavy corruption)
    (TURN_L, ("It is night and the frames are almost black; I can only make out a street lamp, so I guess the "
              "agent has stopped."), 0.0),
    (COUNT, "A woman in a yellow coat crosses the street while two buses wait at the traffic light.", 0.0),
    (SOFA, "The drone climbs above the bridge and follows the river toward the harbour.", 0.0),
    (DRONE, "The camera is mounted on a car driving through a tunnel; the red light ahead means it must stop.", 0.0),
]


def calibrate_thresholds(sims, tiers):
    """(hi, lo, accuracy): the tier thresholds that classify labelled similarities best (sim >= hi ->
    1.0, sim >= lo -> 0.5, else 0.0), searched over the midpoints between observed values; ties go to
    the lower mean absolute error, then to the wider margins (summed) around the thresholds."""
    vals = sorted({float(s) for s in sims})
    cuts = [vals[0] - 1e-3] + [(a + b) / 2 for a, b in itertools.pairwise(vals)] + [vals[-1] + 1e-3]
    margin = {c: min(abs(c - v) for v in vals) for c in cuts}
    best = None
    for i, lo in enumerate(cuts):
        for hi in cuts[i:]:
            pred = [1.0 if s >= hi else 0.5 if s >= lo else 0.0 for s in sims]
            acc = sum(p == t for p, t in zip(pred, tiers)) / len(tiers)
            mae = sum(abs(p - t) for p, t in zip(pred, tiers)) / len(tiers)
            score = (round(acc, 9), -round(mae, 9), margin[hi] + margin[lo])
            if best is None or score > best[0]:
                best = (score, hi, lo, acc)
    return best[1], best[2], best[3]


def _correct(sims, tiers, hi, lo) -> int:
    return sum((1.0 if s >= hi else 0.5 if s >= lo else 0.0) == t for s, t in zip(sims, tiers))


def main():
    import judge

    sims = judge.LocalJudge().similarities([(r, c) for r, c, _ in CALIBRATION_PAIRS])
    tiers = [t for _, _, t in CALIBRATION_PAIRS]
    n = len(tiers)
    for tier in (1.0, 0.5, 0.0):
        s = [x for x, t in zip(sims, tiers) if t == tier]
        print(f"tier {tier}: {len(s)} pairs, similarity {min(s):.2f}-{max(s):.2f}, mean {sum(s) / len(s):.2f}")
    hi, lo = judge.DEFAULT_THRESHOLDS
    print(f"DEFAULT_THRESHOLDS {judge.DEFAULT_THRESHOLDS}: {_correct(sims, tiers, hi, lo)}/{n}; "
          f"always 0.0: {tiers.count(0.0)}/{n}")
    for dh in (-0.03, 0.0, 0.03):
        print(f"  hi {hi + dh:.2f}: " + ", ".join(f"lo {lo + dl:.2f} -> {_correct(sims, tiers, hi + dh, lo + dl)}"
                                                   for dl in (-0.1, 0.0, 0.1)))
    best_hi, best_lo, acc = calibrate_thresholds(sims, tiers)
    print(f"exact optimum: hi {best_hi:.3f}, lo {best_lo:.3f}: {round(acc * n)}/{n}")
    held_out = 0
    for k in range(n):
        h, lo_k, _ = calibrate_thresholds(sims[:k] + sims[k + 1:], tiers[:k] + tiers[k + 1:])
        held_out += _correct(sims[k:k + 1], tiers[k:k + 1], h, lo_k)
    print(f"leave-one-out: {held_out}/{n}")


if __name__ == "__main__":
    main()
