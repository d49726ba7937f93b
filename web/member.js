// A room member and its motion model: where to draw it at a given server
// time. Pure maths: no clock, no I/O; the caller passes every time.
//
// A member's motion is a short list of keyframes, each "at server time t it
// was at (x, y), standing or walking to (tx, ty) at speed cm/s" (the server
// relays what the member sent, stamped with the tick that applied it).
// `positionAt(t)` is meant to be called with a render time slightly in the
// past (see AmbleClient.renderTime), so that the keyframe after t has
// usually arrived already:
//
// - between two keyframes: follow the first one's own motion (standing, or
//   its walk) and blend linearly into the second one's position, so the
//   member arrives exactly where the next update says, when it says;
// - after the newest keyframe: a walk goes on to its target and stops; a
//   member seen moving by standing updates (free movement) is extrapolated
//   for at most `maxExtrapolationMs`, braking to a halt (at most half that
//   time's travel past the last update), then settles back onto the last
//   reported position if nothing newer came: a late update costs a small
//   pause, a stop costs no lasting overshoot;
// - any discontinuity an update causes at the current render time (a
//   resync, an update after a long gap, a late update) is eased out over
//   `easeMs`, never snapped.
//
// Units: centimetres and server milliseconds throughout.

/** Model constants; AmbleClient derives them from the server's Limits. */
export const DEFAULT_TUNING = Object.freeze({
  /** Longest gap between two keyframes that is blended over its whole length. */
  maxInterpolationMs: 1600,
  /** How long past the newest keyframe a free mover is extrapolated. */
  maxExtrapolationMs: 200,
  /** How long a jump takes to ease out. */
  easeMs: 400,
});

/** Keyframes kept per member at most (older ones are dropped). */
const MAX_KEYFRAMES = 16;

/** Jumps shorter than this (cm) are not worth an ease. */
const EASE_EPSILON_CM = 0.5;

/** Smoothstep: 0 at 0, 1 at 1, flat at both ends. */
function smooth(u) {
  if (u <= 0) return 0;
  if (u >= 1) return 1;
  return u * u * (3 - 2 * u);
}

// Scratch space, so that positionAt allocates nothing. Each has one user:
// rawPositionAt writes `out` (which may be `scratch`) and reads `atB`.
const scratch = { x: 0, y: 0 };
const before = { x: 0, y: 0 };
const atB = { x: 0, y: 0 };

/** Where keyframe `k`'s own motion puts the member at `t` (into `out`). */
function along(k, t, out) {
  if (!k.walk || t <= k.t) {
    out.x = k.x;
    out.y = k.y;
    return out;
  }
  const dx = k.tx - k.x;
  const dy = k.ty - k.y;
  const dist = Math.sqrt(dx * dx + dy * dy);
  const travelled = (k.speed * (t - k.t)) / 1000;
  if (dist === 0 || travelled >= dist) {
    out.x = k.tx;
    out.y = k.ty;
  } else {
    const f = travelled / dist;
    out.x = k.x + dx * f;
    out.y = k.y + dy * f;
  }
  return out;
}

/** When keyframe `k`'s walk arrives (its own time when standing). */
function arrival(k) {
  if (!k.walk || k.speed <= 0) return k.t;
  const dx = k.tx - k.x;
  const dy = k.ty - k.y;
  return k.t + (Math.sqrt(dx * dx + dy * dy) * 1000) / k.speed;
}

export class Member {
  /**
   * @param {number} id the member id (unique in the room while it is there)
   * @param {string} name display name
   * @param {{isSelf?: boolean, tuning?: typeof DEFAULT_TUNING}} [options]
   *   `tuning` is read on every call, so a client can share one object.
   */
  constructor(id, name, { isSelf = false, tuning = DEFAULT_TUNING } = {}) {
    /** @readonly */ this.id = id;
    /** @readonly */ this.name = name;
    /** True for the client's own member, whose motion is predicted locally. */
    this.isSelf = isSelf;
    this.tuning = tuning;
    /** @type {{t: number, x: number, y: number, walk: boolean, tx: number, ty: number, speed: number}[]} */
    this.keyframes = [];
    this.easeDx = 0;
    this.easeDy = 0;
    this.easeFrom = 0;
    /** Motion updates applied to this member. */
    this.updates = 0;
    /** The app's data (key → value, frozen; replaced whole on each change). */
    this.data = Object.freeze({});
    /** The app's user id (the token's `sub`) when its token shares it, else null. */
    this.user = null;
  }

  /** A Member from a decoded `amble.v1.Member` (a snapshot or Joined entry). */
  static fromWire(m, options) {
    const member = new Member(m.id, m.name, options);
    const p = m.position ?? { x: 0, y: 0 };
    member.reset(m.movedAtMs, p.x, p.y, m.walk);
    member.setData(m.data);
    member.user = m.user ? m.user : null;
    return member;
  }

  /**
   * Replaces the member's data with wire entries (`[{ key, value }]`, as
   * `Member.data` and `MemberData` carry them). `data` is a frozen plain
   * object, key → value, replaced whole on each change.
   */
  setData(entries) {
    // fromEntries defines own properties: a key like "__proto__" stays data.
    this.data = Object.freeze(Object.fromEntries((entries ?? []).map((e) => [e.key, e.value])));
  }

  /** The server time of the newest keyframe. */
  get movedAtMs() {
    return this.keyframes.length ? this.keyframes[this.keyframes.length - 1].t : 0;
  }

  /**
   * Replaces the whole motion with one keyframe: at `t` at (x, y), walking
   * when `walk` (`{ target: { x, y }, speed }`) is given. With `easeAt` (the
   * current render time), the jump this makes there is eased out.
   */
  reset(t, x, y, walk = null, easeAt = null) {
    const had = easeAt !== null && this.keyframes.length > 0;
    if (had) this.positionAt(easeAt, before);
    if (this.keyframes.length === 1) {
      // Reused in place: free movement resets your own member every frame.
      setKeyframe(this.keyframes[0], t, x, y, walk);
    } else {
      this.keyframes.length = 0;
      this.keyframes.push(keyframe(t, x, y, walk));
    }
    if (had) this.easeFrom_(easeAt);
    else this.easeDx = this.easeDy = 0;
  }

  /**
   * Adds a motion update: at server time `t` the member was at (x, y),
   * standing or walking. `easeAt` is the current render time: any jump the
   * update causes there is eased, and keyframes it no longer needs go.
   */
  update(t, x, y, walk = null, easeAt = null) {
    this.updates++;
    const frames = this.keyframes;
    if (frames.length === 0) {
      frames.push(keyframe(t, x, y, walk));
      return;
    }
    if (easeAt !== null) this.positionAt(easeAt, before);
    const last = frames[frames.length - 1];
    // Newest wins: an update stamped no later than the last one replaces it.
    if (t <= last.t) frames[frames.length - 1] = keyframe(last.t, x, y, walk);
    else frames.push(keyframe(t, x, y, walk));
    if (easeAt !== null) {
      while (frames.length > 2 && frames[1].t <= easeAt) frames.shift();
      this.easeFrom_(easeAt);
    }
    while (frames.length > MAX_KEYFRAMES) frames.shift();
  }

  /** Starts an ease from `before` (the position shown at `t` until now). */
  easeFrom_(t) {
    this.rawPositionAt(t, scratch);
    const dx = before.x - scratch.x;
    const dy = before.y - scratch.y;
    if (dx * dx + dy * dy < EASE_EPSILON_CM * EASE_EPSILON_CM) {
      // No visible jump; keep any ease already running as it was.
      return;
    }
    this.easeDx = dx;
    this.easeDy = dy;
    this.easeFrom = t;
  }

  /**
   * Where to draw the member at server time `t` (ms), eased; writes into
   * and returns `out` (pass one to allocate nothing).
   */
  positionAt(t, out = { x: 0, y: 0 }) {
    this.rawPositionAt(t, out);
    if (this.easeDx !== 0 || this.easeDy !== 0) {
      const easeMs = this.tuning.easeMs;
      const left = easeMs > 0 ? 1 - smooth((t - this.easeFrom) / easeMs) : 0;
      if (left <= 0 && t >= this.easeFrom) {
        this.easeDx = this.easeDy = 0;
      } else {
        out.x += this.easeDx * left;
        out.y += this.easeDy * left;
      }
    }
    return out;
  }

  /** As positionAt, without the ease of a past jump. */
  rawPositionAt(t, out = { x: 0, y: 0 }) {
    const frames = this.keyframes;
    const n = frames.length;
    if (n === 0) {
      out.x = out.y = 0;
      return out;
    }
    // The newest keyframe at or before t (they are few: scan from the end).
    let i = n - 1;
    while (i >= 0 && frames[i].t > t) i--;
    if (i < 0) return along(frames[0], t, out);
    const a = frames[i];
    if (i === n - 1) return this.tail_(t, out);
    const b = frames[i + 1];
    const { maxInterpolationMs } = this.tuning;
    // After a long gap, blend only over the last stretch before b.
    const start = Math.max(a.t, b.t - maxInterpolationMs);
    along(a, t, out);
    if (t <= start) return out;
    along(a, b.t, atB);
    const f = (t - start) / (b.t - start);
    out.x += (b.x - atB.x) * f;
    out.y += (b.y - atB.y) * f;
    return out;
  }

  /** Past the newest keyframe: walk on, or extrapolate a free mover briefly. */
  tail_(t, out) {
    const frames = this.keyframes;
    const n = frames.length;
    const last = frames[n - 1];
    along(last, t, out);
    if (last.walk || n < 2) return out;
    const prev = frames[n - 2];
    const { maxInterpolationMs, maxExtrapolationMs: cap } = this.tuning;
    // Only a stream of standing updates is a free mover with a velocity.
    if (prev.walk || last.t - prev.t > maxInterpolationMs || cap <= 0) return out;
    const span = last.t - Math.max(prev.t, last.t - maxInterpolationMs);
    if (span <= 0) return out;
    const vx = (last.x - prev.x) / span;
    const vy = (last.y - prev.y) / span;
    const tau = t - last.t;
    let k; // effective milliseconds of travel past `last`
    if (tau <= cap) {
      // Brake from the last velocity to a halt at `cap`.
      k = tau - (tau * tau) / (2 * cap);
    } else if (tau < 2 * cap) {
      // Nothing newer came: settle back onto the last reported position.
      k = (cap / 2) * (1 - smooth((tau - cap) / cap));
    } else {
      return out;
    }
    out.x += vx * k;
    out.y += vy * k;
    return out;
  }

  /**
   * When the member is walking at `t`, writes the walk's target into `out`
   * and returns true; false when standing or arrived.
   */
  walkTargetAt(t, out) {
    const frames = this.keyframes;
    let i = frames.length - 1;
    while (i > 0 && frames[i].t > t) i--;
    const k = frames[i];
    if (!k || !k.walk || arrival(k) <= t) return false;
    out.x = k.tx;
    out.y = k.ty;
    return true;
  }
}

function keyframe(t, x, y, walk) {
  return setKeyframe({ t: 0, x: 0, y: 0, walk: false, tx: 0, ty: 0, speed: 0 }, t, x, y, walk);
}

function setKeyframe(k, t, x, y, walk) {
  k.t = t;
  k.x = x;
  k.y = y;
  k.walk = walk !== null && walk !== undefined;
  k.tx = k.walk ? walk.target.x : x;
  k.ty = k.walk ? walk.target.y : y;
  k.speed = k.walk ? walk.speed : 0;
  return k;
}
