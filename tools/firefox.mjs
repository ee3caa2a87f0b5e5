// Firefox through geckodriver and the W3C WebDriver protocol, for the Firefox smoke tests.
// Playwright drives only its own patched Firefox builds, so Debian's `firefox-esr` is driven
// over plain WebDriver: geckodriver is started on a free port and spoken to with `fetch`.
// Headless, with no first-run pages, telemetry or updates reaching the network.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { homedir } from 'node:os';
import { join } from 'node:path';

/** The Firefox binary (`FIREFOX` overrides it). */
export const FIREFOX = process.env.FIREFOX ?? '/usr/bin/firefox-esr';

/** geckodriver: `GECKODRIVER`, else cargo's bin folder, else the PATH. */
export const GECKODRIVER = process.env.GECKODRIVER
  ?? [join(process.env.CARGO_HOME ?? join(homedir(), '.cargo'), 'bin', 'geckodriver')].find(existsSync)
  ?? 'geckodriver';

/** Preferences that keep a headless test profile quiet and off the network. */
const PREFS = {
  'app.update.enabled': false,
  'browser.shell.checkDefaultBrowser': false,
  'browser.startup.homepage_override.mstone': 'ignore',
  'datareporting.policy.dataSubmissionEnabled': false,
  'toolkit.telemetry.enabled': false,
  'network.captive-portal-service.enabled': false,
  'browser.safebrowsing.malware.enabled': false,
  'browser.safebrowsing.phishing.enabled': false,
};

/** A free TCP port on loopback. */
function freePort() {
  return new Promise((resolvePort, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolvePort(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** One WebDriver session in headless Firefox. */
export class Firefox {
  #driver;
  #base;
  #session;

  /** Starts geckodriver and a headless Firefox session; `prefs` are added to the profile's. */
  static async launch({ prefs = {} } = {}) {
    const ff = new Firefox();
    const port = await freePort();
    ff.#driver = spawn(GECKODRIVER, ['--port', String(port), '--host', '127.0.0.1'], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    ff.#driver.stderr.on('data', (d) => { log = (log + d).slice(-4000); });
    const exited = new Promise((resolveExit) => ff.#driver.once('exit', (code) => resolveExit(code)));
    ff.#base = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 20_000;
    for (;;) {
      const early = await Promise.race([exited, sleep(100).then(() => null)]);
      if (early !== null) throw new Error(`geckodriver (${GECKODRIVER}) exited (${early}): ${log}`);
      try {
        const status = await fetch(`${ff.#base}/status`);
        if (status.ok) break;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error(`geckodriver did not start: ${log}`);
    }
    const created = await ff.#send('POST', '/session', {
      capabilities: {
        alwaysMatch: {
          browserName: 'firefox',
          acceptInsecureCerts: true,
          'moz:firefoxOptions': { binary: FIREFOX, args: ['-headless'], prefs: { ...PREFS, ...prefs } },
          timeouts: { script: 900_000, pageLoad: 120_000 },
        },
      },
    });
    ff.#session = created.sessionId;
    ff.capabilities = created.capabilities;
    return ff;
  }

  async #send(method, path, body) {
    const r = await fetch(`${this.#base}${path}`, {
      method,
      headers: { 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const out = await r.json();
    if (!r.ok || out.value?.error) {
      throw new Error(`WebDriver ${method} ${path}: ${out.value?.error}: ${out.value?.message}`);
    }
    return out.value;
  }

  /** Opens `url` and waits for its load event. */
  goto(url) {
    return this.#send('POST', `/session/${this.#session}/url`, { url });
  }

  /** Runs `fn` (a function of `args`, possibly async) in the page and returns its result. */
  evaluate(fn, ...args) {
    const script = `const done = arguments[arguments.length - 1];
      Promise.resolve((${fn.toString()})(...Array.from(arguments).slice(0, -1)))
        .then((v) => done({ ok: v }), (e) => done({ error: String(e && e.stack || e) }));`;
    return this.#send('POST', `/session/${this.#session}/execute/async`, { script, args }).then((r) => {
      if (r && 'error' in r) throw new Error(`in the page: ${r.error}`);
      return r?.ok;
    });
  }

  /** Sets each form field named by id in `values` (id -> value) as typing would: the value,
   * then `input` and `change` events. */
  fill(values) {
    return this.evaluate((entries) => {
      for (const [id, value] of entries) {
        const el = document.getElementById(id);
        el.value = value;
        el.dispatchEvent(new Event('input', { bubbles: true }));
        el.dispatchEvent(new Event('change', { bubbles: true }));
      }
    }, Object.entries(values));
  }

  /** Gives the file input matching `selector` the local file at `path` (an absolute path). */
  async setInputFile(selector, path) {
    const found = await this.#send('POST', `/session/${this.#session}/element`, { using: 'css selector', value: selector });
    const element = Object.values(found)[0];
    await this.#send('POST', `/session/${this.#session}/element/${element}/value`, { text: path });
  }

  /** Polls `fn` in the page every 250 ms until it returns something truthy (returned). */
  async waitFor(fn, { timeout = 60_000, what = 'a condition' } = {}, ...args) {
    const deadline = Date.now() + timeout;
    for (;;) {
      const v = await this.evaluate(fn, ...args);
      if (v) return v;
      if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
      await sleep(250);
    }
  }

  /** Ends the session and geckodriver. */
  async close() {
    try {
      if (this.#session) await this.#send('DELETE', `/session/${this.#session}`);
    } finally {
      this.#driver?.kill();
    }
  }
}
