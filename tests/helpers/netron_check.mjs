// Kiln's headless Netron check: load .om files with the model reader shipped in the PyPI
// `netron` wheel (its view.js / om.js), under Node, with no browser.
//
//   node tests/helpers/netron_check.mjs NETRON_PACKAGE_DIR FILE.om [FILE.om ...]
//
// Prints one JSON array, one entry per file: whether Netron accepted it, the format it
// recognised, and per graph every node with its type, its inputs (with the dtype, shape,
// byte count and sha256 of each initializer Netron pulled from the file) and its chained
// ops (AscendDequant's relu_flag shows as a chained ReLU). Exit status: 0 when every file
// was accepted, 2 otherwise. Used by tests/test_cann_netron.py.
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [, , packageDir, ...files] = process.argv;
if (!packageDir || files.length === 0) {
    console.error('usage: node netron_check.mjs NETRON_PACKAGE_DIR FILE.om [FILE.om ...]');
    process.exit(64);
}
const root = resolve(packageDir);
const load = (name) => import(pathToFileURL(join(root, name)).href);
const base = await load('base.js');
const view = await load('view.js');

const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex');

// The small host interface Netron's model loaders call back into.
const makeHost = (problems) => ({
    get type() { return 'Node'; },
    environment() { return null; },
    event() { },
    exception(error) { problems.push(String(error && error.message ? error.message : error)); },
    async require(id) { return load(`${id}.js`); },
    async asset(name) { return readFile(join(root, name), 'utf-8'); },
});

const describeType = (type) => {
    if (!type) {
        return null;
    }
    const dims = type.shape && Array.isArray(type.shape.dimensions) ? type.shape.dimensions : [];
    return { dtype: type.dataType, shape: dims.map((d) => Number(d)) };
};

const describeValue = (value) => {
    const out = { name: value.name, type: describeType(value.type) };
    const init = value.initializer;
    if (init) {
        const bytes = init.values instanceof Uint8Array ? init.values : null;
        out.initializer = {
            type: describeType(init.type),
            bytes: bytes ? bytes.length : null,
            sha256: bytes ? sha256(bytes) : null,
        };
    }
    return out;
};

const describeNode = (node) => ({
    name: node.name,
    type: node.type && node.type.name,
    inputs: node.inputs.map((arg) => ({ name: arg.name, values: arg.value.map(describeValue) })),
    outputs: node.outputs.map((arg) => ({ name: arg.name, values: arg.value.map(describeValue) })),
    attributes: node.attributes.map((attr) => attr.name),
    chain: (node.chain || []).map((c) => c.type && c.type.name),
});

const check = async (file) => {
    const problems = [];
    const host = makeHost(problems);
    const buffer = new Uint8Array(await readFile(file));
    const context = {
        identifier: basename(file),
        stream: new base.BinaryStream(buffer),
        entries: new Map(),
        asset: (name) => host.asset(name),
        fetch: async () => { throw new Error('no side files'); },
        require: (id) => host.require(id),
        error: (error) => problems.push(String(error && error.message ? error.message : error)),
    };
    try {
        const model = await new view.ModelFactoryService(host).open(context);
        const graphs = (model.modules || []).map((graph) => ({ name: graph.name, nodes: graph.nodes.map(describeNode) }));
        return { file, accepted: true, format: model.format, graphs, problems };
    } catch (error) {
        return { file, accepted: false, error: `${error.name}: ${error.message}`, problems };
    }
};

const results = [];
for (const file of files) {
    results.push(await check(file));
}
console.log(JSON.stringify(results));
process.exitCode = results.every((r) => r.accepted) ? 0 : 2;
