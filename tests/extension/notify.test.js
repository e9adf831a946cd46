// One toast per outage (extension/src/notify.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { SidecarError } from '../../extension/src/client.js';
import { Notices, OutageNotifier, outageMessage } from '../../extension/src/notify.js';
import { outage } from './fake_sidecar.js';

test('dc2: a run of failures asks for exactly one toast', () => {
    const notifier = new OutageNotifier();
    const asks = [1, 2, 3, 4, 5].map(() => notifier.failed(new Error('down')));
    assert.deepEqual(asks, [true, false, false, false, false]);
    assert.equal(notifier.failures, 5);
});

test('dc2: after a success the next failure is a new outage and gets its own toast', () => {
    const notifier = new OutageNotifier();
    assert.equal(notifier.failed(new Error('a')), true);
    assert.equal(notifier.failed(new Error('a')), false);
    assert.equal(notifier.succeeded(), true, 'the outage ended');
    assert.equal(notifier.succeeded(), false, 'nothing to end twice');
    assert.equal(notifier.failed(new Error('b')), true);
});

test('dc2: the toast says memory is off until the sidecar is back, and why', () => {
    const text = outageMessage({ code: 'timeout', message: 'The sidecar did not answer within 1500 ms.' });
    assert.match(text, /not reachable/);
    assert.match(text, /1500 ms/);
});

test('dc2: a missing route or a refused token is not called "not reachable"', () => {
    assert.match(outageMessage({ status: 404, code: 'not_found', message: 'Not Found' }), /lacks a route/);
    assert.match(outageMessage({ status: 401, code: 'unauthorized', message: 'bad token' }), /refused the token/);
    assert.match(outageMessage({ status: 0, code: 'unreachable', message: 'x' }), /not reachable/);
});

function notices() {
    const toasts = [];
    const logged = [];
    const n = new Notices({ toast: (...args) => toasts.push(args), log: { warn: (...args) => logged.push(args) } });
    return { n, toasts, logged };
}

test('dc2: Notices: an outage of many failed calls is one toast, and each failure is logged with what failed', () => {
    const { n, toasts, logged } = notices();
    n.failure(outage(), 'MESSAGE_SENT');
    n.failure(outage());
    assert.equal(toasts.length, 1);
    assert.equal(toasts[0][0], 'warning');
    assert.match(toasts[0][1], /not reachable/);
    assert.deepEqual(logged.map(l => l[0]), ['[Chronicler] MESSAGE_SENT failed:', '[Chronicler] context failed:']);
    n.success();
    n.failure(outage());
    assert.equal(toasts.length, 2, 'after a success the next outage is told again');
});

test('dc2: Notices: a route the sidecar lacks is told once per page load, and is not an outage', () => {
    const { n, toasts } = notices();
    const missing = new SidecarError({ status: 404, code: 'not_found', message: 'Not Found' });
    n.failure(missing);
    n.missingRoute(missing);
    n.failure(missing);
    assert.equal(toasts.length, 1);
    assert.match(toasts[0][1], /lacks a route/);
    assert.equal(n.notifier.down, false, 'no outage began');
});
