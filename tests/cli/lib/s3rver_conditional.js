// s3rver honouring conditional writes as S3 does: a PutObject with
// `If-None-Match: *` fails (412) when the object exists, one with
// `If-Match: ETAG` when it does not exist or has another ETag. s3rver 3.7
// honours these headers on GET only. Writes to a key are serialized here so
// that the check and the write are one step, as in S3. A PUT of a key that
// ends in `head.json` is held DELAY_MS (env S3_HEAD_DELAY_MS) first, so
// that two writers' checks both come before either head lands.
// Usage: node s3rver_conditional.js DIR  (prints "listening on 127.0.0.1:PORT")
const S3rver = require('s3rver');

const dir = process.argv[2];
const delayMs = Number(process.env.S3_HEAD_DELAY_MS || 0);
const queues = new Map(); // key -> the promise of the last write to it

const server = new S3rver({
  address: '127.0.0.1', port: 0, directory: dir, silent: true,
  configureBuckets: [{ name: 'bkt' }],
});

server.middleware.unshift(async (ctx, next) => {
  const ifNone = ctx.headers['if-none-match'];
  const ifMatch = ctx.headers['if-match'];
  if (ctx.method !== 'PUT' || (!ifNone && !ifMatch) || 'partNumber' in ctx.query) {
    return next();
  }
  const [, bucket, ...rest] = ctx.path.split('/');
  const key = decodeURIComponent(rest.join('/'));
  const before = queues.get(key) || Promise.resolve();
  let release;
  const mine = new Promise(resolve => { release = resolve; });
  queues.set(key, before.then(() => mine));
  await before;
  try {
    if (key.endsWith('head.json') && delayMs > 0)
      await new Promise(resolve => setTimeout(resolve, delayMs));
    let etag = null;
    try {
      const meta = await ctx.app.store.getMetadata(bucket, key);
      etag = meta && meta.etag ? String(meta.etag).replace(/"/g, '') : null;
    } catch (err) {
      etag = null; // no such object
    }
    const want = ifMatch ? ifMatch.replace(/"/g, '') : null;
    if ((ifNone === '*' && etag !== null) || (ifMatch && etag !== want)) {
      ctx.status = 412;
      ctx.body = 'PreconditionFailed';
      console.error(`412 ${key} (if-none-match ${ifNone}, if-match ${ifMatch}, have ${etag})`);
      return;
    }
    await next();
  } finally {
    release();
  }
});

server.run().then(addr => {
  console.log(`listening on 127.0.0.1:${addr.port}`);
}, err => {
  console.error(err);
  process.exit(1);
});
