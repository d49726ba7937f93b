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
const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", Ubuntu, Arial, sans-serif';

/** Sprites are drawn at this radius (device px) and scaled down when blitted. */
const SPRITE_RADIUS = 40;
const SPRITE_PAD = 14;
const SPRITE_SIZE = (SPRITE_RADIUS + SPRITE_PAD) * 2;

const TARGET_DASH = [6, 6];
const NO_DASH = [];

/** Pleasant, distinguishable colours on the dark floor. */
export const PALETTE = [
  '#7c9cff', '#f59e9e', '#7fd1b9', '#f5c26b', '#c3a6ff', '#6ccff6',
  '#ff9f7a', '#a3d977', '#f49ac1', '#9ad0ec', '#e6c07b', '#b4a7ff',
];

/** A stable colour for a name (FNV-1a over its UTF-16 units). */
export function colourFor(name) {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return PALETTE[(h >>> 0) % PALETTE.length];
}

function canvas(w, h) {
  const c = document.createElement('canvas');
  c.width = Math.max(1, Math.ceil(w));
  c.height = Math.max(1, Math.ceil(h));
  return c;
}

/** The first letter (a whole code point) of a name, upper-cased. */
function initial(name) {
  const first = [...name.trim()][0] ?? '?';
  return first.toUpperCase();
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

/** A name label pill; `self` gets the accent colour. */
export function labelSprite(name, self, dpr) {
  const size = 12 * dpr;
  const font = `${self ? 700 : 500} ${size}px ${FONT}`;
  const measure = canvas(1, 1).getContext('2d');
  measure.font = font;
  const text = self ? `${name} (you)` : name;
  const w = Math.min(measure.measureText(text).width, 180 * dpr);
  const padX = 7 * dpr;
  const h = size + 8 * dpr;
  const c = canvas(w + padX * 2, h);
  const g = c.getContext('2d');
  g.fillStyle = self ? 'rgba(124,156,255,0.92)' : 'rgba(10,14,20,0.66)';
  roundRect(g, 0, 0, c.width, c.height, h / 2);
  g.fill();
  g.font = font;
  g.textBaseline = 'middle';
  g.fillStyle = self ? '#0b1020' : '#e6edf3';
  g.fillText(text, padX, h / 2 + 0.5 * dpr, w);
  return c;
}

/** A speech bubble with up to four wrapped lines and a tail at the bottom. */
export function bubbleSprite(text, dpr) {
  const size = 13 * dpr;
  const lineH = 17 * dpr;
  const maxW = 210 * dpr;
  const padX = 10 * dpr;
  const padY = 7 * dpr;
  const tail = 7 * dpr;
  const font = `500 ${size}px ${FONT}`;
  const measure = canvas(1, 1).getContext('2d');
  measure.font = font;
  const lines = wrap(measure, text, maxW, 4);
  let w = 0;
  for (const line of lines) w = Math.max(w, measure.measureText(line).width);
  const c = canvas(w + padX * 2, lines.length * lineH + padY * 2 + tail);
  const g = c.getContext('2d');
  const bodyH = c.height - tail;
  g.fillStyle = '#f2f5f9';
  roundRect(g, 0, 0, c.width, bodyH, 10 * dpr);
  g.fill();
  g.beginPath();
  g.moveTo(c.width / 2 - tail, bodyH - 1);
  g.lineTo(c.width / 2, c.height);
  g.lineTo(c.width / 2 + tail, bodyH - 1);
  g.closePath();
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
   * `clockMs` animates the target marker and bubble fades.
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
    const showLabels = radius >= 6 * dpr;
    const margin = size + 120 * dpr;
    for (let i = 0; i < count; i++) {
      const e = entries[i];
      if (e === self) continue;
      const sx = ox + e.x * s;
      const sy = oy + e.y * s;
      if (sx < -margin || sy < -margin || sx > W + margin || sy > H + margin) continue;
      g.drawImage(e.sprite, sx - size / 2, sy - size / 2, size, size);
      if (showLabels) g.drawImage(e.label, Math.round(sx - e.label.width / 2), Math.round(sy + radius + 3 * dpr));
    }
    if (self) {
      const sx = ox + self.x * s;
      const sy = oy + self.y * s;
      g.beginPath();
      g.arc(sx, sy, radius + 3.5 * dpr, 0, Math.PI * 2);
      g.lineWidth = 2.5 * dpr;
      g.strokeStyle = 'rgba(255,255,255,0.9)';
      g.stroke();
      g.drawImage(self.sprite, sx - size / 2, sy - size / 2, size, size);
      g.drawImage(self.label, Math.round(sx - self.label.width / 2), Math.round(sy + radius + 6 * dpr));
    }

    // Speech bubbles on top of everything.
    for (let i = 0; i < count; i++) {
      const e = entries[i];
      if (!e.bubble) continue;
      const left = e.bubbleUntil - clockMs;
      if (left <= 0) {
        e.bubble = null;
        continue;
      }
      const sx = ox + e.x * s;
      const sy = oy + e.y * s;
      const b = e.bubble;
      g.globalAlpha = left < 600 ? left / 600 : 1;
      // Kept inside the canvas when its member is near an edge.
      const bx = clamp(sx - b.width / 2, 4 * dpr, W - b.width - 4 * dpr);
      g.drawImage(b, Math.round(bx), Math.round(sy - radius - 6 * dpr - b.height));
    }
    g.globalAlpha = 1;
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
