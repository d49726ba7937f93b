// The room floor on a 2D canvas: a camera that follows you, the floor,
// avatars with name labels, walk targets and speech bubbles.
//
// Built for hundreds of moving members at 60 fps: avatars, labels and
// bubbles are drawn once into small sprite canvases and then only blitted;
// the per-frame path allocates nothing (no arrays, no strings, no closures).

/** Avatar radius in the world, centimetres. */
export const AVATAR_RADIUS_CM = 34;

const BACKGROUND = '#0b0f14';
const FLOOR = '#161d28';
const TILE = '#18202c';
const TILE_CM = 250;
const GRID_MINOR = 'rgba(255,255,255,0.028)';
const GRID_MAJOR = 'rgba(255,255,255,0.06)';
const EDGE = 'rgba(124,156,255,0.45)';
const ACCENT = '#7c9cff';
const BUBBLE = '#f2f5f9';
const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", Ubuntu, Arial, sans-serif';

/** Sprites are drawn at this radius (device px) and scaled down when blitted. */
const SPRITE_RADIUS = 40;
const SPRITE_PAD = 14;
const SPRITE_SIZE = (SPRITE_RADIUS + SPRITE_PAD) * 2;

/** Bubbles placed per frame at most; edge markers drawn at most. */
const MAX_BUBBLES = 32;
const MAX_MARKERS = 64;
/** Up to this many members off screen, each gets a marker; beyond, only those worth finding. */
const MAX_ALL_MARKERS = 40;

const TARGET_DASH = [6, 6];
const NO_DASH = [];

/** Pleasant, distinguishable colours on the dark floor. */
export const PALETTE = [
  '#7c9cff', '#f59e9e', '#7fd1b9', '#f5c26b', '#c3a6ff', '#6ccff6',
  '#ff9f7a', '#a3d977', '#f49ac1', '#9ad0ec', '#e6c07b', '#b4a7ff',
];

/** A stable colour for a name (FNV-1a over its UTF-16 units). */
export function colourFor(name) {
  return PALETTE[paletteIndex(name)];
}

function paletteIndex(name) {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0) % PALETTE.length;
}

/**
 * A colour for a member called `name` that differs from `taken` (the
 * colours of others present with the same name), so that two people with
 * one name can be told apart: the name's own colour if free, else the free
 * palette colour furthest from every taken one.
 */
export function distinctColour(name, taken) {
  const own = PALETTE[paletteIndex(name)];
  if (!taken.includes(own)) return own;
  let best = own;
  let bestDist = -1;
  for (const c of PALETTE) {
    if (taken.includes(c)) continue;
    let near = Infinity;
    for (const t of taken) near = Math.min(near, colourDistance(c, t));
    if (near > bestDist) {
      best = c;
      bestDist = near;
    }
  }
  return best;
}

/** Euclidean distance of two #rrggbb colours in RGB. */
export function colourDistance(a, b) {
  const x = parseInt(a.slice(1), 16);
  const y = parseInt(b.slice(1), 16);
  const dr = ((x >> 16) & 255) - ((y >> 16) & 255);
  const dg = ((x >> 8) & 255) - ((y >> 8) & 255);
  const db = (x & 255) - (y & 255);
  return Math.sqrt(dr * dr + dg * dg + db * db);
}

function canvas(w, h) {
  const c = document.createElement('canvas');
  c.width = Math.max(1, Math.ceil(w));
  c.height = Math.max(1, Math.ceil(h));
  return c;
}

const graphemes = typeof Intl !== 'undefined' && Intl.Segmenter ? new Intl.Segmenter(undefined, { granularity: 'grapheme' }) : null;

/** The first user-perceived character (grapheme cluster) of a name, upper-cased: "🇫🇷 Marie" gives "🇫🇷". */
export function initial(name) {
  const trimmed = name.trim();
  if (!trimmed) return '?';
  let first;
  if (graphemes) {
    for (const { segment } of graphemes.segment(trimmed)) {
      first = segment;
      break;
    }
  } else {
    first = [...trimmed][0];
  }
  return first.toUpperCase();
}

/**
 * `text` cut with an ellipsis to fit `maxW` as measured by `measure(text)`,
 * never inside a grapheme cluster; unchanged when it fits.
 */
export function ellipsize(text, maxW, measure) {
  if (measure(text) <= maxW) return text;
  const parts = graphemes ? Array.from(graphemes.segment(text), (g) => g.segment) : [...text];
  let lo = 0;
  let hi = parts.length;
  // The longest prefix that fits with the ellipsis (binary search).
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (measure(`${parts.slice(0, mid).join('').trimEnd()}…`) <= maxW) lo = mid;
    else hi = mid - 1;
  }
  return `${parts.slice(0, lo).join('').trimEnd()}…`;
}

/** An avatar disc with a soft shadow and the name's initial. */
export function avatarSprite(name, colour) {
  const c = canvas(SPRITE_SIZE, SPRITE_SIZE);
  const g = c.getContext('2d');
  const cx = SPRITE_SIZE / 2;
  const cy = SPRITE_SIZE / 2;
  g.save();
  g.shadowColor = 'rgba(0,0,0,0.55)';
  g.shadowBlur = 12;
  g.shadowOffsetY = 5;
  g.beginPath();
  g.arc(cx, cy, SPRITE_RADIUS, 0, Math.PI * 2);
  g.fillStyle = colour;
  g.fill();
  g.restore();
  // A little light from the top left.
  const shine = g.createRadialGradient(cx - 14, cy - 16, 4, cx, cy, SPRITE_RADIUS);
  shine.addColorStop(0, 'rgba(255,255,255,0.35)');
  shine.addColorStop(0.6, 'rgba(255,255,255,0.04)');
  shine.addColorStop(1, 'rgba(0,0,0,0.12)');
  g.beginPath();
  g.arc(cx, cy, SPRITE_RADIUS, 0, Math.PI * 2);
  g.fillStyle = shine;
  g.fill();
  g.lineWidth = 3;
  g.strokeStyle = 'rgba(10,14,20,0.35)';
  g.stroke();
  g.fillStyle = 'rgba(11,15,20,0.82)';
  g.font = `700 ${Math.round(SPRITE_RADIUS * 0.95)}px ${FONT}`;
  g.textAlign = 'center';
  g.textBaseline = 'middle';
  g.fillText(initial(name), cx, cy + 2);
  return c;
}

/** Longest name label, CSS px; longer names are cut with an ellipsis. */
const LABEL_MAX_CSS = 150;

/**
 * A name label pill; `self` gets the accent colour. `tag` tells same-named
 * members apart. A `status` (member data) is a second, smaller line under
 * the name.
 */
export function labelSprite(name, self, dpr, tag = '', status = '') {
  const size = 12 * dpr;
  const font = `${self ? 700 : 500} ${size}px ${FONT}`;
  const statusSize = 10.5 * dpr;
  const statusFont = `500 ${statusSize}px ${FONT}`;
  const measure = canvas(1, 1).getContext('2d');
  measure.font = font;
  const suffix = `${tag ? ` ${tag}` : ''}${self ? ' (you)' : ''}`;
  const suffixW = suffix ? measure.measureText(suffix).width : 0;
  const shown = ellipsize(name, LABEL_MAX_CSS * dpr - suffixW, (t) => measure.measureText(t).width);
  const text = `${shown}${suffix}`;
  const nameW = measure.measureText(text).width;
  let w = nameW;
  let statusText = '';
  if (status) {
    measure.font = statusFont;
    statusText = ellipsize(status, LABEL_MAX_CSS * dpr, (t) => measure.measureText(t).width);
    w = Math.max(w, measure.measureText(statusText).width);
  }
  const padX = 7 * dpr;
  const lineH = size + 8 * dpr;
  const h = statusText ? lineH + statusSize + 2 * dpr : lineH;
  const c = canvas(w + padX * 2, h);
  const g = c.getContext('2d');
  g.fillStyle = self ? 'rgba(124,156,255,0.92)' : 'rgba(10,14,20,0.72)';
  roundRect(g, 0, 0, c.width, c.height, Math.min(lineH / 2, h / 2));
  g.fill();
  g.font = font;
  g.textBaseline = 'middle';
  g.fillStyle = self ? '#0b1020' : '#e6edf3';
  // With a status both lines are centred; alone, the name sits as it always did.
  g.fillText(text, statusText ? (c.width - nameW) / 2 : padX, lineH / 2 + 0.5 * dpr);
  if (statusText) {
    g.font = statusFont;
    g.fillStyle = self ? 'rgba(11,16,32,0.8)' : 'rgba(230,237,243,0.72)';
    g.fillText(statusText, (c.width - g.measureText(statusText).width) / 2, lineH - 1 * dpr + statusSize / 2);
  }
  return c;
}

/**
 * A speech bubble: up to `maxLines` wrapped lines at most `maxCssW` wide.
 * The tail is drawn with the bubble, towards its speaker (FloorView.draw).
 */
export function bubbleSprite(text, dpr, maxCssW = 210, maxLines = 4) {
  const size = 13 * dpr;
  const lineH = 17 * dpr;
  const maxW = maxCssW * dpr;
  const padX = 10 * dpr;
  const padY = 7 * dpr;
  const font = `500 ${size}px ${FONT}`;
  const measure = canvas(1, 1).getContext('2d');
  measure.font = font;
  const lines = wrap(measure, text, maxW, maxLines);
  let w = 0;
  for (const line of lines) w = Math.max(w, measure.measureText(line).width);
  const c = canvas(w + padX * 2, lines.length * lineH + padY * 2);
  const g = c.getContext('2d');
  g.fillStyle = BUBBLE;
  roundRect(g, 0, 0, c.width, c.height, 10 * dpr);
  g.fill();
  g.font = font;
  g.fillStyle = '#10151c';
  g.textBaseline = 'middle';
  lines.forEach((line, i) => g.fillText(line, padX, padY + lineH * (i + 0.5)));
  return c;
}

function wrap(g, text, maxW, maxLines) {
  const words = text.split(/\s+/).filter(Boolean);
  const lines = [];
  let line = '';
  for (let word of words) {
    // Break words longer than a line.
    while (g.measureText(word).width > maxW) {
      let cut = word.length - 1;
      while (cut > 1 && g.measureText(word.slice(0, cut)).width > maxW) cut--;
      if (line) lines.push(line);
      lines.push(word.slice(0, cut));
      line = '';
      word = word.slice(cut);
    }
    const next = line ? `${line} ${word}` : word;
    if (g.measureText(next).width <= maxW) line = next;
    else {
      lines.push(line);
      line = word;
    }
  }
  if (line) lines.push(line);
  if (lines.length > maxLines) {
    lines.length = maxLines;
    let last = lines[maxLines - 1];
    while (last.length > 1 && g.measureText(`${last}…`).width > maxW) last = last.slice(0, -1);
    lines[maxLines - 1] = `${last}…`;
  }
  return lines.length ? lines : [''];
}

function roundRect(g, x, y, w, h, r) {
  g.beginPath();
  if (g.roundRect) g.roundRect(x, y, w, h, r);
  else g.rect(x, y, w, h);
}

/** Calm floor decorations, placed from the room name so each room has its own. */
function decorFor(room, width, height) {
  let seed = 0x9e3779b9;
  for (let i = 0; i < room.length; i++) seed = Math.imul(seed ^ room.charCodeAt(i), 0x85ebca6b);
  const rand = () => {
    seed = Math.imul(seed ^ (seed >>> 15), 0x2c1b3c6d);
    seed ^= seed + Math.imul(seed ^ (seed >>> 7), 0x297a2d39);
    return ((seed ^ (seed >>> 14)) >>> 0) / 4294967296;
  };
  const tints = [
    ['rgba(124,156,255,0.06)', 'rgba(124,156,255,0.16)'],
    ['rgba(127,209,185,0.05)', 'rgba(127,209,185,0.14)'],
    ['rgba(245,194,107,0.045)', 'rgba(245,194,107,0.13)'],
    ['rgba(195,166,255,0.055)', 'rgba(195,166,255,0.15)'],
  ];
  // A 3 x 3 layout: the plaza in the middle, rugs in some of the outer cells.
  const cellW = width / 3;
  const cellH = height / 3;
  const rugs = [];
  for (let cell = 0; cell < 9; cell++) {
    if (cell === 4 || rand() < 0.45) continue;
    const w = cellW * (0.5 + rand() * 0.25);
    const h = cellH * (0.45 + rand() * 0.25);
    const cx = (cell % 3) * cellW + cellW / 2 + (rand() - 0.5) * (cellW - w) * 0.6;
    const cy = Math.floor(cell / 3) * cellH + cellH / 2 + (rand() - 0.5) * (cellH - h) * 0.6;
    const tint = tints[rugs.length % tints.length];
    rugs.push({ x: cx - w / 2, y: cy - h / 2, w, h, r: Math.min(w, h) * 0.12, fill: tint[0], edge: tint[1] });
  }
  return { rugs, plaza: { x: width / 2, y: height / 2, r: Math.min(width, height) * 0.12 } };
}

export class FloorView {
  constructor(canvasEl) {
    this.canvas = canvasEl;
    this.ctx = canvasEl.getContext('2d', { alpha: false });
    this.dpr = 1;
    this.cssW = 1;
    this.cssH = 1;
    this.worldW = 5000;
    this.worldH = 5000;
    this.zoom = 1;
    this.baseScale = 0.4; // CSS px per cm at zoom 1
    this.camX = 2500;
    this.camY = 2500;
    this.camReady = false;
    this.decor = decorFor('lobby', this.worldW, this.worldH);
    this.highlightId = null;
    this.highlightUntil = 0;
    this.grid = new LabelGrid();
    this.placed = new Float64Array(MAX_BUBBLES * 4);
    this.placedCount = 0;
    this.markers = Array.from({ length: MAX_MARKERS }, () => ({ id: 0, x: 0, y: 0 }));
    this.markerCount = 0;
    this.markerPoint = { x: 0, y: 0 };
    this.avoid = [];
    this.miniMap = { ready: false, ox: 0, oy: 0, k: 1 };
    this.resize();
  }

  setWorld(room, width, height) {
    this.worldW = width;
    this.worldH = height;
    this.decor = decorFor(room, width, height);
    this.camReady = false;
  }

  /** Matches the canvas to its CSS size and the device pixel ratio. */
  resize() {
    const dpr = Math.min(globalThis.devicePixelRatio || 1, 3);
    const w = Math.max(1, this.canvas.clientWidth);
    const h = Math.max(1, this.canvas.clientHeight);
    this.dpr = dpr;
    this.cssW = w;
    this.cssH = h;
    this.canvas.width = Math.round(w * dpr);
    this.canvas.height = Math.round(h * dpr);
    this.grid.resize(this.canvas.width, this.canvas.height, 10 * dpr);
    // About 13 m across the shorter side; avatars never tiny on a phone.
    this.baseScale = Math.min(0.7, Math.max(0.38, Math.min(w, h) / 1300));
    return dpr;
  }

  /** CSS px per centimetre. */
  get scale() {
    return this.baseScale * this.zoom;
  }

  zoomBy(factor) {
    // Zoomed out no further than the whole world in view.
    const fit = Math.min(this.cssW / this.worldW, this.cssH / this.worldH) / this.baseScale;
    this.zoom = Math.min(3, Math.max(Math.min(1, fit * 0.9), this.zoom * factor));
  }

  /** World point under a CSS pixel of the canvas; writes into `out`. */
  screenToWorld(px, py, out) {
    const s = this.scale;
    out.x = this.camX + (px - this.cssW / 2) / s;
    out.y = this.camY + (py - this.cssH / 2) / s;
    return out;
  }

  /** Eases the camera towards (x, y), keeping the world on screen. */
  follow(x, y, dtMs) {
    const s = this.scale;
    const viewW = this.cssW / s;
    const viewH = this.cssH / s;
    const pad = 300;
    const tx = viewW >= this.worldW + pad * 2 ? this.worldW / 2 : clamp(x, viewW / 2 - pad, this.worldW - viewW / 2 + pad);
    const ty = viewH >= this.worldH + pad * 2 ? this.worldH / 2 : clamp(y, viewH / 2 - pad, this.worldH - viewH / 2 + pad);
    if (!this.camReady) {
      this.camX = tx;
      this.camY = ty;
      this.camReady = true;
      return;
    }
    const k = 1 - Math.exp(-dtMs / 180);
    this.camX += (tx - this.camX) * k;
    this.camY += (ty - this.camY) * k;
  }

  /**
   * Draws one frame. `entries[0..count)` carry each member's sprite, label,
   * bubble and rendered position (x, y in cm); `self` is yours (or null).
   * `clockMs` animates the target marker, highlights and bubble fades.
   * Writes each entry's screen position (`sx`, `sy`, device px) and whether
   * it is on screen (`onScreen`), and the edge markers (`markers`).
   */
  draw(entries, count, self, clockMs) {
    const g = this.ctx;
    const dpr = this.dpr;
    const W = this.canvas.width;
    const H = this.canvas.height;
    const s = this.scale * dpr; // device px per cm
    const ox = W / 2 - this.camX * s;
    const oy = H / 2 - this.camY * s;

    g.setTransform(1, 0, 0, 1, 0, 0);
    g.globalAlpha = 1;
    g.fillStyle = BACKGROUND;
    g.fillRect(0, 0, W, H);
    this.drawFloor(g, s, ox, oy, W, H);

    // Walk targets: others faintly in one path, yours marked.
    g.lineWidth = 1.5 * dpr;
    g.strokeStyle = 'rgba(230,237,243,0.22)';
    g.beginPath();
    const rr = 4 * dpr;
    for (let i = 0; i < count; i++) {
      const e = entries[i];
      if (!e.walking || e === self) continue;
      const sx = ox + e.tx * s;
      const sy = oy + e.ty * s;
      if (sx < -rr || sy < -rr || sx > W + rr || sy > H + rr) continue;
      g.moveTo(sx + rr, sy);
      g.arc(sx, sy, rr, 0, Math.PI * 2);
    }
    g.stroke();
    if (self && self.walking) this.drawTarget(g, self, s, ox, oy, clockMs);

    // Avatars, back to front; yours last so it is never hidden.
    sortByY(entries, count);
    const radius = Math.max(5 * dpr, AVATAR_RADIUS_CM * s);
    const spriteScale = radius / SPRITE_RADIUS;
    const size = SPRITE_SIZE * spriteScale;
    const margin = size;
    let offScreen = 0;
    for (let i = 0; i < count; i++) {
      const e = entries[i];
      const sx = ox + e.x * s;
      const sy = oy + e.y * s;
      e.sx = sx;
      e.sy = sy;
      e.onScreen = sx > -radius && sy > -radius && sx < W + radius && sy < H + radius;
      if (!e.onScreen && e !== self) offScreen++;
      if (e === self) continue;
      if (sx < -margin || sy < -margin || sx > W + margin || sy > H + margin) continue;
      g.drawImage(e.sprite, sx - size / 2, sy - size / 2, size, size);
    }
    if (self) {
      g.beginPath();
      g.arc(self.sx, self.sy, radius + 3.5 * dpr, 0, Math.PI * 2);
      g.lineWidth = 2.5 * dpr;
      g.strokeStyle = 'rgba(255,255,255,0.9)';
      g.stroke();
      g.drawImage(self.sprite, self.sx - size / 2, self.sy - size / 2, size, size);
    }
    const lit = this.highlighted(entries, count, clockMs);
    if (lit && lit.onScreen) {
      // Someone you went to: a ring that pulses outwards.
      const pulse = (clockMs % 1000) / 1000;
      g.beginPath();
      g.arc(lit.sx, lit.sy, radius + (4 + pulse * 14) * dpr, 0, Math.PI * 2);
      g.lineWidth = 2.5 * dpr;
      g.strokeStyle = ACCENT;
      g.globalAlpha = 1 - pulse;
      g.stroke();
      g.globalAlpha = 1;
    }

    this.drawLabels(g, entries, count, self, lit, radius);
    this.drawBubbles(g, entries, count, self, radius, clockMs);
    this.drawMarkers(g, entries, count, self, lit, offScreen, clockMs);
  }

  /** The member to highlight (`highlightId` until `highlightUntil`), or null. */
  highlighted(entries, count, clockMs) {
    if (this.highlightId === null || clockMs > this.highlightUntil) return null;
    for (let i = 0; i < count; i++) if (entries[i].id === this.highlightId) return entries[i];
    return null;
  }

  /** Marks member `id` for `ms` (e.g. after "go to" from the People list). */
  highlight(id, untilMs) {
    this.highlightId = id;
    this.highlightUntil = untilMs;
  }

  /**
   * Name labels, after every avatar so that none is covered, and only where
   * they do not overlap one already drawn: yours first, then the highlighted
   * member, then the others front to back.
   */
  drawLabels(g, entries, count, self, lit, radius) {
    const dpr = this.dpr;
    const grid = this.grid;
    grid.clear();
    if (radius < 6 * dpr) return; // too small to name
    const W = this.canvas.width;
    const H = this.canvas.height;
    const gap = 3 * dpr;
    if (self && self.onScreen) {
      // Your avatar and label stay clear of the others' labels.
      grid.mark(self.sx - radius, self.sy - radius, self.sx + radius, self.sy + radius);
      this.placeLabel(g, self, radius + 6 * dpr, W, H, true);
    }
    if (lit && lit !== self && lit.onScreen) this.placeLabel(g, lit, radius + gap, W, H, true);
    for (let i = count - 1; i >= 0; i--) {
      const e = entries[i];
      if (e === self || e === lit || !e.onScreen) continue;
      this.placeLabel(g, e, radius + gap, W, H, false);
    }
  }

  placeLabel(g, e, below, W, H, always) {
    const l = e.label;
    const x = Math.round(e.sx - l.width / 2);
    const y = Math.round(e.sy + below);
    if (x + l.width < 0 || y + l.height < 0 || x > W || y > H) return;
    if (!always && !this.grid.fits(x, y, x + l.width, y + l.height)) return;
    this.grid.mark(x, y, x + l.width, y + l.height);
    g.drawImage(l, x, y);
  }

  /**
   * Speech bubbles of members on screen, on top of everything: above the
   * speaker, or below when there is no room above, or moved one step off a
   * bubble already there. A bubble that would still cover another bubble,
   * your avatar, a panel over the floor or the edge is shown as a speech dot
   * over its speaker instead (the chat panel has the words). An off-screen
   * speaker's bubble is not drawn: its edge marker shows it.
   */
  drawBubbles(g, entries, count, self, radius, clockMs) {
    const dpr = this.dpr;
    const W = this.canvas.width;
    const H = this.canvas.height;
    const gap = 6 * dpr;
    const tail = 7 * dpr;
    this.placedCount = 0;
    for (let i = 0; i < count; i++) {
      const e = entries[i];
      if (!e.bubble) continue;
      const left = e.bubbleUntil - clockMs;
      if (left <= 0) {
        e.bubble = null;
        continue;
      }
      if (!e.onScreen) continue;
      const b = e.bubble;
      const bw = b.width;
      const bh = b.height;
      const bx = clamp(e.sx - bw / 2, 4 * dpr, W - bw - 4 * dpr);
      const aboveY = e.sy - radius - gap - tail - bh;
      const belowY = e.sy + radius + 22 * dpr + tail; // under the name label
      let by = this.bubbleSpot(e, self, bx, aboveY, bw, bh, -1, radius);
      if (by === null) by = this.bubbleSpot(e, self, bx, belowY, bw, bh, 1, radius);
      g.globalAlpha = left < 600 ? left / 600 : 1;
      g.fillStyle = BUBBLE;
      if (by === null) {
        // No clear spot: a speech dot over the speaker.
        const dx = e.sx + radius * 0.75;
        const dy = e.sy - radius * 0.95;
        g.beginPath();
        g.arc(dx, dy, 6 * dpr, 0, Math.PI * 2);
        g.fill();
        g.fillStyle = '#10151c';
        for (let k = -1; k <= 1; k++) g.fillRect(dx + k * 3 * dpr - dpr, dy - dpr, 2 * dpr, 2 * dpr);
        continue;
      }
      this.placeBubble(bx, by, bw, bh);
      g.drawImage(b, Math.round(bx), Math.round(by));
      // The tail, pointing at the speaker.
      const below = by > e.sy;
      const tx = clamp(e.sx, bx + tail * 2, bx + bw - tail * 2);
      const baseY = below ? by : by + bh;
      g.beginPath();
      g.moveTo(tx - tail, baseY);
      g.lineTo(clamp(e.sx, tx - tail, tx + tail), below ? by - tail : by + bh + tail);
      g.lineTo(tx + tail, baseY);
      g.closePath();
      g.fill();
    }
    g.globalAlpha = 1;
  }

  /**
   * Where a bubble `bw` x `bh` at (bx, y) can go (device px): y itself, or
   * one step further out (`dir` -1 up, 1 down) past a bubble in the way;
   * null when neither is clear.
   */
  bubbleSpot(e, self, bx, y, bw, bh, dir, radius) {
    const dpr = this.dpr;
    const H = this.canvas.height;
    const gap = 6 * dpr;
    const edge = 4 * dpr;
    for (let step = 0; step < 2; step++) {
      if (y < edge || y + bh > H - edge) return null;
      let hit = this.bubbleHit(bx, y, bw, bh);
      if (hit < 0 && self && e !== self) {
        const r = radius + 4 * dpr;
        if (bx < self.sx + r && bx + bw > self.sx - r && y < self.sy + r && y + bh > self.sy - r) return null;
      }
      if (hit < 0) hit = this.obstacleHit(bx, y, bw, bh) ? -2 : -1;
      if (hit === -1) return y;
      if (hit === -2) return null;
      const p = this.placed;
      y = dir < 0 ? p[hit + 1] - gap - bh : p[hit + 3] + gap;
    }
    return null;
  }

  /** The offset in `placed` of a bubble that meets the rectangle, or -1. */
  bubbleHit(x, y, w, h) {
    const p = this.placed;
    for (let k = 0; k < this.placedCount; k++) {
      const o = k * 4;
      if (x < p[o + 2] && x + w > p[o] && y < p[o + 3] && y + h > p[o + 1]) return o;
    }
    return -1;
  }

  /** True when the rectangle (device px) meets a panel over the canvas. */
  obstacleHit(x, y, w, h) {
    const dpr = this.dpr;
    for (let k = 0; k < this.avoid.length; k++) {
      const o = this.avoid[k];
      if (x < o.x1 * dpr && x + w > o.x0 * dpr && y < o.y1 * dpr && y + h > o.y0 * dpr) return true;
    }
    return false;
  }

  placeBubble(x, y, w, h) {
    if (this.placedCount >= MAX_BUBBLES) return;
    const o = this.placedCount++ * 4;
    this.placed[o] = x;
    this.placed[o + 1] = y;
    this.placed[o + 2] = x + w;
    this.placed[o + 3] = y + h;
  }

  /**
   * Markers at the canvas edge for members off screen, in their direction:
   * every one when few are, else the ones worth finding (chatting, just
   * arrived, or the one you went to). Each is a small avatar; a speech dot
   * shows that it is talking. Kept in `markers` for `markerAt`.
   */
  drawMarkers(g, entries, count, self, lit, offScreen, clockMs) {
    this.markerCount = 0;
    const all = offScreen <= MAX_ALL_MARKERS;
    // The one you went to first, then those talking, then the rest: a
    // marker that would cover one already drawn is left out.
    if (lit && lit !== self && !lit.onScreen) this.drawMarker(g, lit, lit, clockMs);
    for (let pass = 0; pass < 2; pass++) {
      for (let i = 0; i < count; i++) {
        const e = entries[i];
        if (e === self || e === lit || e.onScreen) continue;
        const talking = e.bubble !== null && e.bubbleUntil > clockMs;
        if (talking !== (pass === 0)) continue;
        if (!all && !talking && !(e.notableUntil > clockMs)) continue;
        if (this.markerCount >= this.markers.length) return;
        this.drawMarker(g, e, lit, clockMs);
      }
    }
  }

  drawMarker(g, e, lit, clockMs) {
    const dpr = this.dpr;
    const W = this.canvas.width;
    const H = this.canvas.height;
    const r = 12 * dpr;
    const inset = r + 8 * dpr;
    const at = this.markerPoint;
    edgePoint(W / 2, H / 2, e.sx, e.sy, inset, inset, W - inset, H - inset, at);
    // Off the panels over the canvas (stats, minimap, zoom), along the edge.
    for (let k = 0; k < this.avoid.length; k++) {
      const o = this.avoid[k];
      const x0 = o.x0 * dpr - r;
      const y0 = o.y0 * dpr - r;
      const x1 = o.x1 * dpr + r;
      const y1 = o.y1 * dpr + r;
      if (at.x <= x0 || at.x >= x1 || at.y <= y0 || at.y >= y1) continue;
      const onTopOrBottom = at.y <= inset + 1 || at.y >= H - inset - 1;
      if (onTopOrBottom) at.x = at.x - x0 < x1 - at.x && x0 > inset ? x0 : x1 < W - inset ? x1 : x0;
      else at.y = at.y - y0 < y1 - at.y && y0 > inset ? y0 : y1 < H - inset ? y1 : y0;
    }
    const mx = at.x;
    const my = at.y;
    for (let k = 0; k < this.markerCount; k++) {
      const m = this.markers[k];
      if (Math.abs(m.x * dpr - mx) < r * 1.6 && Math.abs(m.y * dpr - my) < r * 1.6) return;
    }
    // An arrow outwards, then the avatar.
    const ang = Math.atan2(e.sy - my, e.sx - mx);
    const cos = Math.cos(ang);
    const sin = Math.sin(ang);
    g.beginPath();
    g.moveTo(mx + cos * (r + 7 * dpr), my + sin * (r + 7 * dpr));
    g.lineTo(mx + cos * r * 0.55 - sin * r * 0.75, my + sin * r * 0.55 + cos * r * 0.75);
    g.lineTo(mx + cos * r * 0.55 + sin * r * 0.75, my + sin * r * 0.55 - cos * r * 0.75);
    g.closePath();
    g.fillStyle = e.colour;
    g.fill();
    const size = (SPRITE_SIZE * r) / SPRITE_RADIUS;
    g.drawImage(e.sprite, mx - size / 2, my - size / 2, size, size);
    if (e === lit) {
      g.beginPath();
      g.arc(mx, my, r + 3 * dpr, 0, Math.PI * 2);
      g.lineWidth = 2 * dpr;
      g.strokeStyle = ACCENT;
      g.stroke();
    }
    if (e.bubble !== null && e.bubbleUntil > clockMs) {
      g.beginPath();
      g.arc(mx + r * 0.8, my - r * 0.8, 5 * dpr, 0, Math.PI * 2);
      g.fillStyle = BUBBLE;
      g.fill();
    }
    const m = this.markers[this.markerCount++];
    m.id = e.id;
    m.x = mx / dpr;
    m.y = my / dpr;
  }

  /** Rectangles over the canvas (CSS px: {x0, y0, x1, y1}) that markers keep off. */
  setObstacles(rects) {
    this.avoid = rects;
  }

  /** The id of the member whose edge marker is under CSS pixel (px, py), or null. */
  markerAt(px, py) {
    const reach = 18;
    for (let i = this.markerCount - 1; i >= 0; i--) {
      const m = this.markers[i];
      if (Math.abs(m.x - px) <= reach && Math.abs(m.y - py) <= reach) return m.id;
    }
    return null;
  }

  /**
   * The minimap: the whole world, the part in view, and a dot per member
   * (yours ringed, the highlighted one larger). `mini` is its canvas.
   */
  drawMinimap(mini, entries, count, self, clockMs) {
    const dpr = this.dpr;
    const cw = Math.max(1, Math.round(mini.clientWidth * dpr));
    const ch = Math.max(1, Math.round(mini.clientHeight * dpr));
    if (mini.width !== cw || mini.height !== ch) {
      mini.width = cw;
      mini.height = ch;
    }
    const g = mini.getContext('2d');
    const pad = 6 * dpr;
    const k = Math.min((cw - pad * 2) / this.worldW, (ch - pad * 2) / this.worldH);
    const ox = (cw - this.worldW * k) / 2;
    const oy = (ch - this.worldH * k) / 2;
    g.setTransform(1, 0, 0, 1, 0, 0);
    g.clearRect(0, 0, cw, ch);
    g.fillStyle = 'rgba(22,29,40,0.9)';
    roundRect(g, ox, oy, this.worldW * k, this.worldH * k, 4 * dpr);
    g.fill();
    g.lineWidth = dpr;
    g.strokeStyle = EDGE;
    g.stroke();
    // The view.
    const s = this.scale;
    const vw = this.cssW / s;
    const vh = this.cssH / s;
    g.strokeStyle = 'rgba(230,237,243,0.55)';
    g.strokeRect(ox + (this.camX - vw / 2) * k, oy + (this.camY - vh / 2) * k, vw * k, vh * k);
    const dot = (count <= 60 ? 5 : 2) * dpr; // easy to see in a small room
    for (let i = 0; i < count; i++) {
      const e = entries[i];
      if (e === self) continue;
      g.fillStyle = e.colour;
      g.fillRect(ox + e.x * k - dot / 2, oy + e.y * k - dot / 2, dot, dot);
    }
    const lit = this.highlighted(entries, count, clockMs);
    if (lit && lit !== self) {
      g.beginPath();
      g.arc(ox + lit.x * k, oy + lit.y * k, 4 * dpr, 0, Math.PI * 2);
      g.lineWidth = 1.5 * dpr;
      g.strokeStyle = ACCENT;
      g.stroke();
    }
    if (self) {
      g.beginPath();
      g.arc(ox + self.x * k, oy + self.y * k, 3 * dpr, 0, Math.PI * 2);
      g.fillStyle = '#ffffff';
      g.fill();
    }
    const mm = this.miniMap;
    mm.ready = true;
    mm.ox = ox;
    mm.oy = oy;
    mm.k = k / dpr;
  }

  /** The world point under CSS pixel (px, py) of the minimap, clamped to the world; into `out`. */
  minimapToWorld(px, py, out) {
    const m = this.miniMap;
    if (!m.ready) return null;
    out.x = clamp((px - m.ox / this.dpr) / m.k, 0, this.worldW);
    out.y = clamp((py - m.oy / this.dpr) / m.k, 0, this.worldH);
    return out;
  }

  drawFloor(g, s, ox, oy, W, H) {
    const ww = this.worldW;
    const wh = this.worldH;
    // Visible world rectangle, clipped to the world.
    const x0 = Math.max(0, -ox / s);
    const y0 = Math.max(0, -oy / s);
    const x1 = Math.min(ww, (W - ox) / s);
    const y1 = Math.min(wh, (H - oy) / s);
    if (x1 <= x0 || y1 <= y0) return;

    g.fillStyle = FLOOR;
    g.fillRect(ox, oy, ww * s, wh * s);
    // Checker tiles.
    g.fillStyle = TILE;
    const tx0 = Math.floor(x0 / TILE_CM);
    const ty0 = Math.floor(y0 / TILE_CM);
    const tx1 = Math.ceil(x1 / TILE_CM);
    const ty1 = Math.ceil(y1 / TILE_CM);
    for (let ty = ty0; ty < ty1; ty++) {
      for (let tx = tx0 + ((tx0 + ty) & 1); tx < tx1; tx += 2) {
        const w = Math.min(TILE_CM, ww - tx * TILE_CM);
        const h = Math.min(TILE_CM, wh - ty * TILE_CM);
        g.fillRect(ox + tx * TILE_CM * s, oy + ty * TILE_CM * s, w * s, h * s);
      }
    }
    // Rugs and the central plaza.
    const { rugs, plaza } = this.decor;
    for (let i = 0; i < rugs.length; i++) {
      const r = rugs[i];
      g.fillStyle = r.fill;
      roundRect(g, ox + r.x * s, oy + r.y * s, r.w * s, r.h * s, r.r * s);
      g.fill();
      g.lineWidth = Math.max(1, 1.5 * this.dpr);
      g.strokeStyle = r.edge;
      g.stroke();
    }
    g.beginPath();
    g.arc(ox + plaza.x * s, oy + plaza.y * s, plaza.r * s, 0, Math.PI * 2);
    g.fillStyle = 'rgba(124,156,255,0.05)';
    g.fill();
    g.lineWidth = Math.max(1, 2 * this.dpr);
    g.strokeStyle = 'rgba(124,156,255,0.12)';
    g.stroke();

    // Grid: a line a metre, stronger every five, if they are far enough apart.
    const step = s * 100 >= 14 * this.dpr ? 100 : 500;
    this.gridLines(g, s, ox, oy, x0, y0, x1, y1, step, step === 100 ? GRID_MINOR : GRID_MAJOR);
    if (step === 100) this.gridLines(g, s, ox, oy, x0, y0, x1, y1, 500, GRID_MAJOR);

    // The world's edge.
    g.lineWidth = 2 * this.dpr;
    g.strokeStyle = EDGE;
    roundRect(g, ox, oy, ww * s, wh * s, 6 * this.dpr);
    g.stroke();
  }

  gridLines(g, s, ox, oy, x0, y0, x1, y1, step, colour) {
    g.beginPath();
    for (let x = Math.ceil(x0 / step) * step; x <= x1; x += step) {
      const sx = Math.round(ox + x * s) + 0.5;
      g.moveTo(sx, oy + y0 * s);
      g.lineTo(sx, oy + y1 * s);
    }
    for (let y = Math.ceil(y0 / step) * step; y <= y1; y += step) {
      const sy = Math.round(oy + y * s) + 0.5;
      g.moveTo(ox + x0 * s, sy);
      g.lineTo(ox + x1 * s, sy);
    }
    g.lineWidth = 1;
    g.strokeStyle = colour;
    g.stroke();
  }

  drawTarget(g, e, s, ox, oy, clockMs) {
    const dpr = this.dpr;
    const sx = ox + e.x * s;
    const sy = oy + e.y * s;
    const tx = ox + e.tx * s;
    const ty = oy + e.ty * s;
    g.setLineDash(TARGET_DASH);
    g.lineDashOffset = -clockMs / 40;
    g.beginPath();
    g.moveTo(sx, sy);
    g.lineTo(tx, ty);
    g.lineWidth = 1.5 * dpr;
    g.strokeStyle = 'rgba(124,156,255,0.55)';
    g.stroke();
    g.setLineDash(NO_DASH);
    const pulse = (clockMs % 1200) / 1200;
    g.beginPath();
    g.arc(tx, ty, (6 + pulse * 10) * dpr, 0, Math.PI * 2);
    g.lineWidth = 2 * dpr;
    g.strokeStyle = ACCENT;
    g.globalAlpha = 0.8 * (1 - pulse);
    g.stroke();
    g.globalAlpha = 1;
    g.beginPath();
    g.arc(tx, ty, 4 * dpr, 0, Math.PI * 2);
    g.fillStyle = ACCENT;
    g.fill();
  }
}

/**
 * Where the ray from (cx, cy) towards (px, py) leaves the rectangle
 * [x0, x1] x [y0, y1] (which holds (cx, cy)); (px, py) itself when inside.
 * Writes into `out`.
 */
export function edgePoint(cx, cy, px, py, x0, y0, x1, y1, out) {
  const dx = px - cx;
  const dy = py - cy;
  let t = 1;
  if (dx > 0) t = Math.min(t, (x1 - cx) / dx);
  else if (dx < 0) t = Math.min(t, (x0 - cx) / dx);
  if (dy > 0) t = Math.min(t, (y1 - cy) / dy);
  else if (dy < 0) t = Math.min(t, (y0 - cy) / dy);
  out.x = cx + dx * Math.max(0, t);
  out.y = cy + dy * Math.max(0, t);
  return out;
}

/**
 * Which parts of the canvas already hold a label: a coarse grid of cells,
 * so that placing hundreds of labels a frame costs little and allocates
 * nothing.
 */
export class LabelGrid {
  constructor() {
    this.cols = 0;
    this.rows = 0;
    this.cell = 1;
    this.cells = new Uint8Array(0);
  }

  resize(width, height, cell) {
    this.cell = Math.max(1, cell);
    this.cols = Math.ceil(width / this.cell) + 1;
    this.rows = Math.ceil(height / this.cell) + 1;
    this.cells = new Uint8Array(this.cols * this.rows);
  }

  clear() {
    this.cells.fill(0);
  }

  /** True when no marked cell meets the rectangle (device px; off-canvas parts are free). */
  fits(x0, y0, x1, y1) {
    return this.scan(x0, y0, x1, y1, false);
  }

  mark(x0, y0, x1, y1) {
    this.scan(x0, y0, x1, y1, true);
  }

  scan(x0, y0, x1, y1, mark) {
    const c0 = Math.max(0, Math.floor(x0 / this.cell));
    const r0 = Math.max(0, Math.floor(y0 / this.cell));
    const c1 = Math.min(this.cols - 1, Math.floor((x1 - 1) / this.cell));
    const r1 = Math.min(this.rows - 1, Math.floor((y1 - 1) / this.cell));
    for (let r = r0; r <= r1; r++) {
      const row = r * this.cols;
      for (let c = c0; c <= c1; c++) {
        if (mark) this.cells[row + c] = 1;
        else if (this.cells[row + c]) return false;
      }
    }
    return true;
  }
}

/** Insertion sort by y: the order barely changes between frames, so this is near O(n). */
function sortByY(a, n) {
  for (let i = 1; i < n; i++) {
    const e = a[i];
    const y = e.y;
    let j = i - 1;
    while (j >= 0 && a[j].y > y) {
      a[j + 1] = a[j];
      j--;
    }
    a[j + 1] = e;
  }
}

function clamp(v, lo, hi) {
  return v < lo ? lo : v > hi ? hi : v;
}
