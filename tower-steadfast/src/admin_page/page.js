// The admin page's script. Every value from the server is written with
// `textContent` (or as a `dataset` value), never as markup: a breaker key
// or a dead letter holding `<script>` shows as those characters.
'use strict';

(function () {
  const POLL_MS = 2000;
  const TOKEN_KEY = 'tower-steadfast-admin-token';
  let token = sessionStorage.getItem(TOKEN_KEY) || '';
  let previous = null;
  let label = null;
  let pending = null;
  let timer = null;

  const $ = (id) => document.getElementById(id);

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function cell(row, text, className) {
    row.appendChild(el('td', text, className));
  }

  function button(text, className, onClick) {
    const node = el('button', text, className);
    node.type = 'button';
    node.addEventListener('click', onClick);
    return node;
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return '';
    if (ms < 1000) return ms + ' ms';
    const s = ms / 1000;
    if (s < 120) return s.toFixed(1) + ' s';
    return Math.round(s / 60) + ' min';
  }

  function rate(now, before, seconds) {
    if (before === undefined || seconds <= 0) return '…';
    return Math.max(0, (now - before) / seconds).toFixed(2);
  }

  function notice(text, isError) {
    const node = $('notice');
    node.textContent = text;
    node.className = isError ? 'error' : '';
    node.hidden = false;
  }

  class Unauthorized extends Error {}

  async function api(method, path, body) {
    const init = {
      method: method,
      headers: { Authorization: 'Bearer ' + token },
      credentials: 'omit',
      cache: 'no-store',
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const response = await fetch('api/' + path, init);
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    if (response.status === 401) throw new Unauthorized('the token was refused');
    if (!response.ok) {
      throw new Error((data && (data.message || data.code)) || ('HTTP ' + response.status));
    }
    return data;
  }

  function ask(text, action) {
    pending = action;
    $('confirm-text').textContent = text;
    $('confirm').hidden = false;
  }

  async function act(describe, run) {
    try {
      const result = await run();
      notice(describe(result), false);
    } catch (error) {
      if (error instanceof Unauthorized) return signOut('The token was refused.');
      notice('Failed: ' + error.message, true);
    }
    await refresh();
  }

  function breakerAction(key, path, verb) {
    return act(() => verb + ': ' + key, () => api('POST', 'breakers/' + path, { key: key }));
  }

  function renderBreakers(state, seconds) {
    const rows = $('breaker-rows');
    rows.replaceChildren();
    const before = previous ? previous.rejected : {};
    for (const b of state.breakers) {
      const row = el('tr');
      row.dataset.key = b.key;
      cell(row, b.key, 'wrap key');
      cell(row, b.state, 'state state-' + b.state);
      // A consecutive-failures breaker keeps no window: its count is the
      // run of failures in a row.
      cell(row, b.window_calls > 0 ? b.window_failures + ' of ' + b.window_calls + ' calls' : '–', 'num');
      cell(row, b.consecutive_failures, 'num');
      cell(row, b.failures, 'num');
      cell(row, b.state === 'open' ? duration(b.remaining_open_ms) : '', 'num');
      cell(row, rate(b.rejected, before[b.key], seconds), 'num');
      cell(row, b.opened, 'num');
      const actions = el('td');
      actions.appendChild(button('Force open', 'force-open danger', () =>
        breakerAction(b.key, 'force-open', 'Forced open')));
      actions.appendChild(button('Force closed', 'force-closed', () =>
        breakerAction(b.key, 'force-closed', 'Forced closed')));
      actions.appendChild(button('Reset', 'reset', () =>
        breakerAction(b.key, 'reset', 'Reset')));
      row.appendChild(actions);
      rows.appendChild(row);
    }
    const shown = state.breakers.length;
    $('breaker-count').textContent = shown < state.breakers_total
      ? '(first ' + shown + ' of ' + state.breakers_total + ')'
      : '(' + shown + ')';
  }

  function renderRates(state, seconds) {
    const rows = $('rate-rows');
    rows.replaceChildren();
    const before = previous ? previous.retries : {};
    for (const r of state.retries) {
      const row = el('tr');
      row.dataset.stack = r.name;
      cell(row, r.name, 'wrap');
      if (r.counted === false) {
        const none = el('td', 'not counted: this stack\'s retry layer was built by hand', 'note');
        none.colSpan = 4;
        row.appendChild(none);
      } else {
        const was = before[r.name] || {};
        for (const field of ['retries', 'gave_up', 'budget_exhausted', 'recovered']) {
          cell(row, rate(r[field], was[field], seconds) + ' (' + r[field] + ')', 'num ' + field);
        }
      }
      rows.appendChild(row);
    }
  }

  function renderStore(store, container) {
    const box = el('div', null, 'store');
    box.dataset.store = store.store;
    if (store.error) {
      box.appendChild(el('p', 'Store ' + store.store + ': ' + store.error, 'error'));
      container.appendChild(box);
      return;
    }
    const head = el('h3', 'Store ' + store.store + ': ');
    const depth = el('span', store.depth, 'depth');
    head.appendChild(depth);
    head.appendChild(document.createTextNode(store.depth === 1 ? ' entry' : ' entries'));
    box.appendChild(head);

    const labels = el('div', null, 'labels');
    for (const [name, count] of Object.entries(store.by_label)) {
      const item = el('span');
      item.dataset.label = name;
      item.appendChild(el('b', name));
      item.appendChild(document.createTextNode(': ' + count + (store.by_label_complete ? '' : '+') + ' '));
      item.appendChild(button('Show', 'filter', () => { label = name; refresh(); }));
      item.appendChild(button('Purge label…', 'purge-label danger', () =>
        ask('Remove every entry labelled "' + name + '" from store ' + store.store + '?', () =>
          act((r) => 'Purged ' + r.purged + ' entries labelled ' + name,
            () => api('POST', 'dead-letters/purge', { store: store.store, label: name })))));
      labels.appendChild(item);
    }
    if (!store.by_label_complete) {
      labels.appendChild(el('span', 'counted over the first ' + store.scanned + ' entries', 'note'));
    }
    box.appendChild(labels);

    const table = el('table');
    const header = el('tr');
    for (const name of ['Id', 'Label', 'Kind', 'Attempts', 'Request', 'Error', 'Failed', 'Actions']) {
      header.appendChild(el('th', name));
    }
    table.appendChild(el('thead')).appendChild(header);
    const body = el('tbody');
    const now = Date.now();
    for (const e of store.newest) {
      const row = el('tr', null, 'entry');
      row.dataset.id = e.id;
      cell(row, e.id.slice(0, 12) + '…', 'id');
      cell(row, e.label, 'wrap');
      cell(row, e.kind);
      cell(row, e.attempts, 'num');
      cell(row, [e.method, e.uri].filter(Boolean).join(' '), 'wrap');
      cell(row, e.error, 'wrap');
      cell(row, duration(now - e.last_failed_at_ms) + ' ago', 'num');
      const actions = el('td');
      actions.appendChild(button('Show', 'show', () => show(store.store, e.id)));
      actions.appendChild(button('Replay…', 'replay', () =>
        ask('Send entry ' + e.id + ' again?', () =>
          act((r) => 'Replayed ' + e.id + ': ' + r.outcome + (r.error ? ' (' + r.error + ')' : ''),
            () => api('POST', 'dead-letters/replay', { store: store.store, id: e.id })))));
      actions.appendChild(button('Purge…', 'purge danger', () =>
        ask('Remove entry ' + e.id + ' without sending it?', () =>
          act((r) => 'Purged ' + r.purged + ' entry',
            () => api('POST', 'dead-letters/purge', { store: store.store, id: e.id })))));
      row.appendChild(actions);
      body.appendChild(row);
    }
    table.appendChild(body);
    box.appendChild(table);
    if (store.newest.length === 0) box.appendChild(el('p', 'No entries.', 'note empty'));
    container.appendChild(box);
  }

  async function show(store, id) {
    try {
      const entry = await api('GET', 'dead-letters/entry?store=' + encodeURIComponent(store) +
        '&id=' + encodeURIComponent(id));
      $('entry-id').textContent = id;
      $('entry-body').textContent = JSON.stringify(entry, null, 2);
      $('entry').hidden = false;
    } catch (error) {
      if (error instanceof Unauthorized) return signOut('The token was refused.');
      notice('Failed: ' + error.message, true);
    }
  }

  function render(state) {
    const at = state.now_ms;
    const seconds = previous ? (at - previous.at) / 1000 : 0;
    renderBreakers(state, seconds);
    renderRates(state, seconds);
    const stores = $('stores');
    stores.replaceChildren();
    for (const store of state.dead_letters) renderStore(store, stores);
    $('label-filter').textContent = label === null ? '' : 'Newest entries labelled "' + label + '".';
    if (label !== null) {
      $('label-filter').appendChild(button('Show all', 'unfilter', () => { label = null; refresh(); }));
    }
    const rejected = {};
    for (const b of state.breakers) rejected[b.key] = b.rejected;
    const retries = {};
    for (const r of state.retries) retries[r.name] = r;
    previous = { at: at, rejected: rejected, retries: retries };
    $('status').textContent = 'Live, updated ' + new Date(at).toLocaleTimeString() + '.';
  }

  async function refresh() {
    clearTimeout(timer);
    if (!token) return;
    try {
      const query = 'state' + (label === null ? '' : '?label=' + encodeURIComponent(label));
      render(await api('GET', query));
    } catch (error) {
      if (error instanceof Unauthorized) return signOut('The token was refused.');
      $('status').textContent = 'Not updated: ' + error.message;
    }
    timer = setTimeout(refresh, POLL_MS);
  }

  function signIn(value) {
    token = value;
    sessionStorage.setItem(TOKEN_KEY, token);
    $('login').hidden = true;
    $('main').hidden = false;
    $('sign-out').hidden = false;
    refresh();
  }

  function signOut(why) {
    clearTimeout(timer);
    token = '';
    previous = null;
    sessionStorage.removeItem(TOKEN_KEY);
    $('login').hidden = false;
    $('main').hidden = true;
    $('sign-out').hidden = true;
    $('status').textContent = why || 'Signed out.';
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('sign-in').addEventListener('click', () => {
      const value = $('token').value.trim();
      $('token').value = '';
      if (value) signIn(value);
    });
    $('token').addEventListener('keydown', (event) => {
      if (event.key === 'Enter') $('sign-in').click();
    });
    $('sign-out').addEventListener('click', () => signOut());
    $('confirm-yes').addEventListener('click', () => {
      const action = pending;
      pending = null;
      $('confirm').hidden = true;
      if (action) action();
    });
    $('confirm-no').addEventListener('click', () => {
      pending = null;
      $('confirm').hidden = true;
    });
    $('entry-close').addEventListener('click', () => { $('entry').hidden = true; });
    if (token) signIn(token);
  });
})();
