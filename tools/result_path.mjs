// Default names for benchmark results: `<dir>/<stem>.json`, or `<stem>-2.json`, `-3`, ... when
// that is taken, so that a second run on the same day keeps the first one's file (as the native
// `emberlm bench` names its results).
import { existsSync } from 'node:fs';
import { join } from 'node:path';

/** The first of `<dir>/<stem>.json`, `<dir>/<stem>-2.json`, ... that does not exist yet. */
export function freshResultPath(dir, stem) {
  const first = join(dir, `${stem}.json`);
  if (!existsSync(first)) return first;
  for (let n = 2; ; n += 1) {
    const p = join(dir, `${stem}-${n}.json`);
    if (!existsSync(p)) return p;
  }
}
