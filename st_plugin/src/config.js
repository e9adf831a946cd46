'use strict';
// What `chronicler install-extension` recorded beside the plugin (plugin.config.json): the command
// that starts this checkout's sidecar, its data folder, the log file. Node built-ins only.

const fs = require('node:fs');
const path = require('node:path');

const CONFIG_FILE = 'plugin.config.json';
/** Where the sidecar listens, for the `chronicler` commands (mode 0600: it holds the token). */
const CONNECTION_FILE = 'sidecar.json';

/**
 * The recorded install, or an Error saying what is missing.
 * @param {string} folder the plugin's folder
 * @param {NodeJS.ProcessEnv} env CHRONICLER_PLUGIN_CONFIG may name another file (tests)
 * @returns {{command: string[], dataDir: string, logFile: string, version: string} | Error}
 */
function readConfig(folder, env = process.env) {
    const file = env.CHRONICLER_PLUGIN_CONFIG || path.join(folder, CONFIG_FILE);
    let data;
    try {
        data = JSON.parse(fs.readFileSync(file, 'utf8'));
    } catch (error) {
        return new Error(`cannot read ${file} (run \`chronicler install-extension --sillytavern ST_DIR\` again): ${error.message}`);
    }
    const command = data.command;
    if (!Array.isArray(command) || command.length === 0 || !command.every(part => typeof part === 'string')) {
        return new Error(`${file}: "command" must be a non-empty list of strings`);
    }
    if (typeof data.dataDir !== 'string' || !data.dataDir) return new Error(`${file}: "dataDir" is missing`);
    return {
        command,
        dataDir: data.dataDir,
        logFile: typeof data.logFile === 'string' && data.logFile ? data.logFile : path.join(data.dataDir, 'sidecar.log'),
        version: typeof data.version === 'string' ? data.version : '',
    };
}

/**
 * Write where the sidecar listens, readable by this user only (the token is in it).
 * @param {string} dataDir
 * @param {{url: string, port: number, token: string, pid: number}} where
 */
function writeConnection(dataDir, where) {
    fs.mkdirSync(dataDir, { recursive: true });
    const file = path.join(dataDir, CONNECTION_FILE);
    const tmp = `${file}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, JSON.stringify({ ...where, plugin_pid: process.pid }, null, 1) + '\n', { mode: 0o600 });
    fs.chmodSync(tmp, 0o600);
    fs.renameSync(tmp, file);
    return file;
}

/** Remove the connection file if it still names this process's sidecar. */
function removeConnection(dataDir) {
    const file = path.join(dataDir, CONNECTION_FILE);
    try {
        const data = JSON.parse(fs.readFileSync(file, 'utf8'));
        if (data.plugin_pid === process.pid) fs.unlinkSync(file);
    } catch {
        // absent or unreadable: nothing to remove
    }
}

module.exports = { CONFIG_FILE, CONNECTION_FILE, readConfig, writeConnection, removeConnection };
