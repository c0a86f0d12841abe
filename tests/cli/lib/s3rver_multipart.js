// s3rver with the multipart upload calls it lacks or takes too easily, as
// S3 answers them: AbortMultipartUpload (s3rver: 405) drops the upload's
// parts (204; 404 NoSuchUpload for an unknown upload);
// CompleteMultipartUpload refuses a part that was not put or whose ETag is
// not the one given (400 InvalidPart; s3rver concatenates whatever part
// files it finds), and an unknown upload (404 NoSuchUpload); UploadPart of
// an unknown upload is 404 NoSuchUpload (s3rver creates it). No
// authentication on the abort (a test stand-in). Faults on demand: a
// completion of a key ending in "error-in-200.safetensors" is answered 200
// with an <Error> body (as S3 may, after it has begun answering); with env
// S3_CUT_GETS=N, the first N GETs of keys under objects/ send half their
// body and drop the connection; with env S3_FAIL_HEAD_FILE=PATH, while the
// file PATH exists, a PUT of a key ending "/head.json" is answered 500
// InternalError and nothing is written (a store's upload that fails at its
// head, after its objects went up). Everything else is s3rver's.
// Usage: node s3rver_multipart.js DIR (prints "listening on 127.0.0.1:PORT")
const fs = require('fs');
const path = require('path');
const S3rver = require('s3rver');
const S3Error = require('s3rver/lib/models/error');

const dir = process.argv[2];
const server = new S3rver({
  address: '127.0.0.1', port: 0, directory: dir, silent: true,
  configureBuckets: [{ name: 'bkt' }],
});
const store = server.store;

// The folder s3rver keeps an upload's key and parts in; null when the id
// is not one (no path tricks) or the upload is not there.
function uploadDir(bucket, uploadId) {
  if (!/^[0-9A-Za-z_-]+$/.test(String(uploadId))) return null;
  const d = path.join(store.getResourcePath(bucket, undefined, 'uploads'), uploadId);
  return fs.existsSync(path.join(d, 'key')) ? d : null;
}

function noSuchUpload() {
  return new S3Error('NoSuchUpload', 'The specified upload does not exist. The upload ID ' +
    'may be invalid, or the upload may have been aborted or completed.');
}

const putPart = store.putPart.bind(store);
store.putPart = async (bucket, uploadId, partNumber, content) => {
  if (uploadDir(bucket, uploadId) === null) {
    content.resume(); // drain the body
    throw noSuchUpload();
  }
  return putPart(bucket, uploadId, partNumber, content);
};

const complete = store.putObjectMultipart.bind(store);
store.putObjectMultipart = async (bucket, uploadId, parts) => {
  const d = uploadDir(bucket, uploadId);
  if (d === null) throw noSuchUpload();
  for (const part of parts) {
    let md5 = null;
    try {
      md5 = fs.readFileSync(path.join(d, `${part.number}.md5`)).toString().trim();
    } catch (err) {
      md5 = null;
    }
    if (md5 === null || md5 !== part.etag) {
      throw new S3Error('InvalidPart', 'One or more of the specified parts could not be ' +
        "found. The part may not have been uploaded, or the specified entity tag may not " +
        "match the part's entity tag.", { PartNumber: part.number, ETag: part.etag });
    }
  }
  return complete(bucket, uploadId, parts);
};

server.middleware.unshift(async (ctx, next) => {
  if (ctx.method !== 'DELETE' || !('uploadId' in ctx.query)) return next();
  const [, bucket] = ctx.path.split('/');
  const d = uploadDir(bucket, ctx.query.uploadId);
  if (d === null) {
    const err = noSuchUpload();
    ctx.status = err.status;
    ctx.type = 'application/xml';
    ctx.body = err.toXML();
    return;
  }
  fs.rmSync(d, { recursive: true, force: true });
  ctx.status = 204;
});

server.middleware.unshift(async (ctx, next) => {
  if (ctx.method !== 'POST' || !('uploadId' in ctx.query) ||
      !ctx.path.endsWith('error-in-200.safetensors'))
    return next();
  ctx.status = 200;
  ctx.type = 'application/xml';
  ctx.body = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError' +
    '</Code><Message>We encountered an internal error. Please try again.' +
    '</Message></Error>';
});

let cutGets = Number(process.env.S3_CUT_GETS || 0);
server.middleware.unshift(async (ctx, next) => {
  if (ctx.method !== 'GET' || cutGets <= 0 || !ctx.path.includes('/objects/'))
    return next();
  await next();
  if (ctx.status !== 200 || ctx.body == null) return;
  cutGets--;
  const chunks = [];
  for await (const chunk of ctx.body) chunks.push(Buffer.from(chunk));
  const whole = Buffer.concat(chunks);
  ctx.respond = false; // written here: half, then the connection dropped
  ctx.res.writeHead(200, { 'Content-Length': whole.length });
  ctx.res.write(whole.subarray(0, Math.floor(whole.length / 2)), () => {
    ctx.req.socket.destroy();
  });
});

const failHeadFile = process.env.S3_FAIL_HEAD_FILE || '';
server.middleware.unshift(async (ctx, next) => {
  if (ctx.method !== 'PUT' || failHeadFile === '' || !ctx.path.endsWith('/head.json') ||
      !fs.existsSync(failHeadFile))
    return next();
  ctx.req.resume(); // drain the body
  const err = new S3Error('InternalError', 'We encountered an internal error. Please try ' +
    'again.');
  ctx.status = 500;
  ctx.type = 'application/xml';
  ctx.body = err.toXML();
});

server.run().then(addr => {
  console.log(`listening on 127.0.0.1:${addr.port}`);
}, err => {
  console.error(err);
  process.exit(1);
});
