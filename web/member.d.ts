// Types of member.js: a room member and its motion model. Written by hand
// for the public API (see codec.d.ts).

import type { DataEntry, Position, WireMember } from './codec.js';

/** The motion model's constants; AmbleClient derives them from the server's Limits. */
export interface Tuning {
  /** Longest gap between two keyframes that is blended over its whole length (ms). */
  maxInterpolationMs: number;
  /** How long past the newest keyframe a free mover is extrapolated (ms). */
  maxExtrapolationMs: number;
  /** How long a jump takes to ease out (ms). */
  easeMs: number;
}
export declare const DEFAULT_TUNING: Readonly<Tuning>;

/** One keyframe: at server time `t` at (x, y), standing, or walking to (tx, ty) at `speed` cm/s. */
export interface Keyframe {
  t: number;
  x: number;
  y: number;
  walk: boolean;
  tx: number;
  ty: number;
  speed: number;
}

/** A walk as a Member takes it. */
export interface MemberWalk {
  target: Position;
  speed: number;
}

/** A member of the room and its motion: where to draw it at a server time. */
export declare class Member {
  constructor(id: number, name: string, options?: { isSelf?: boolean; tuning?: Tuning });
  /** A Member from a decoded `amble.v1.Member`. */
  static fromWire(m: WireMember, options?: { isSelf?: boolean; tuning?: Tuning }): Member;
  /** The member id, unique in the room while it is there (not across reconnects). */
  readonly id: number;
  /** The display name, in NFC. */
  readonly name: string;
  /** True for the client's own member, whose motion is predicted locally. */
  isSelf: boolean;
  /** The app's data (key → value, frozen; replaced whole on each change). */
  data: Readonly<Record<string, string>>;
  /** The app's user id (the token's `sub`) when its token shares it, else null. */
  user: string | null;
  /** Replaces the data with wire entries (`[{ key, value }]`). */
  setData(entries: DataEntry[] | null | undefined): void;
  tuning: Tuning;
  /** Newest last; at most 16. */
  keyframes: Keyframe[];
  /** Motion updates applied to this member. */
  updates: number;
  /** The server time of the newest keyframe. */
  readonly movedAtMs: number;
  /** Replaces the motion with one keyframe; with `easeAt` (a render time) the jump there is eased. */
  reset(t: number, x: number, y: number, walk?: MemberWalk | null, easeAt?: number | null): void;
  /** Adds a keyframe from a motion update. */
  update(t: number, x: number, y: number, walk?: MemberWalk | null, easeAt?: number | null): void;
  /** Where to draw the member at server time `t` (cm); writes into `out` when given. */
  positionAt<T extends Position = Position>(t: number, out?: T): T;
  /** True, with the target in `out`, while the member walks at `t`. */
  walkTargetAt(t: number, out: Position): boolean;
}
