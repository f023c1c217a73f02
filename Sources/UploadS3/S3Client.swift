#if canImport(Glibc)
import Glibc
#endif
import AsyncHTTPClient
import UploadChecksums
import Foundation
import Logging
import NIOCore
import NIOHTTP1

/// Where an S3-compatible service answers, and how to sign for it.
public struct S3Endpoint: Sendable, Hashable {
    /// `http://127.0.0.1:8333` or `https://s3.eu-central-1.amazonaws.com`; requests use path-style addressing
    /// (`/bucket/key`), which every S3-compatible server takes.
    public var url: URL
    public var region: String

    public init(url: URL, region: String) {
        self.url = url
        self.region = region
    }
}

/// A request the server refused or answered in a way the client cannot use: names the operation, the bucket and key,
/// the server's code and message, and what usually fixes it.
public struct S3Error: Error, Sendable, CustomStringConvertible {
    public var operation: String
    public var bucket: String
    public var key: String?
    /// The HTTP status (0 when no answer came).
    public var status: Int
    /// S3's error code (`NoSuchKey`, `PreconditionFailed`, `BadDigest`, ...), or the HTTP reason when the body had none.
    public var code: String
    public var message: String
    public var requestID: String?

    public var description: String {
        let object = self.key.map { "s3://\(self.bucket)/\($0)" } ?? "s3://\(self.bucket)"
        var text = "S3 \(self.operation) of \(object) failed: \(self.code)"
        if self.status != 0 { text += " (HTTP \(self.status))" }
        if !self.message.isEmpty { text += ": \(self.message)" }
        if let hint = Self.hints[self.code] { text += "; \(hint)" }
        if let id = self.requestID { text += " [request \(id)]" }
        return text
    }

    static let hints: [String: String] = [
        "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY and --s3-region",
        "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID",
        "AccessDenied": "the key may not write this bucket",
        "NoSuchBucket": "create the bucket first, or check the name in --store",
        "NoSuchUpload": "the multipart upload was completed or aborted",
        "BadDigest": "the bytes changed on the way (checksum mismatch)",
        "PreconditionFailed": "an object already exists under this key",
    ]

    /// True when the key already holds an object (If-None-Match: * refused).
    public var isPreconditionFailed: Bool { self.status == 412 || self.code == "PreconditionFailed" }
    /// True when the request may or may not have taken effect: no answer, or a server error (S3's 500 and 503 come with
    /// "we may have done it").
    public var outcomeUnknown: Bool { self.status == 0 || self.status >= 500 }
    /// True for a missing key, upload or object.
    public var isNotFound: Bool { self.status == 404 || self.code == "NoSuchKey" || self.code == "NoSuchUpload" }
}

/// A request body: bytes in memory, or a range of an open file read as it is sent (a part of many MiB never sits
/// in memory whole).
public enum S3Body: Sendable {
    case bytes(ByteBuffer)
    /// `length` bytes of the file `descriptor` from `offset`, and their SHA-256 in hex (signed over plain HTTP; the
    /// caller hashes them in the same pass as their checksum). The descriptor stays the caller's.
    case file(descriptor: Int32, offset: Int64, length: Int64, sha256: String)

    var length: Int64 {
        switch self {
        case .bytes(let buffer): return Int64(buffer.readableBytes)
        case .file(_, _, let length, _): return length
        }
    }
}

/// What HEAD says of an object.
public struct S3ObjectInfo: Sendable, Hashable {
    public var size: Int64
    public var etag: String
    /// `x-amz-checksum-sha1` when the server keeps it (base64).
    public var checksumSHA1: String?
}

/// One part of a multipart upload, as CompleteMultipartUpload lists it.
public struct S3Part: Sendable, Hashable, Codable {
    public var number: Int
    public var etag: String
    /// Base64 SHA-1 of the part, when the upload was created with the SHA-1 checksum.
    public var checksumSHA1: String?

    public init(number: Int, etag: String, checksumSHA1: String? = nil) {
        self.number = number
        self.etag = etag
        self.checksumSHA1 = checksumSHA1
    }
}

/// The S3 requests the relay makes, signed with SigV4, over async-http-client. Path-style, one bucket per call.
///
/// Bodies are ByteBuffers the caller holds (a part of a few MiB at most). Over plain HTTP every body's SHA-256 is
/// signed; over HTTPS a body that carries `x-amz-checksum-sha1` goes `UNSIGNED-PAYLOAD` (TLS and the checksum
/// protect it), as the AWS SDKs do.
public final class S3Client: Sendable {
    public let endpoint: S3Endpoint

    /// Whether a body sent with `x-amz-checksum-sha1` needs its SHA-256 (``S3Body/file(descriptor:offset:length:sha256:)``):
    /// over plain HTTP only. Over HTTPS it goes `UNSIGNED-PAYLOAD`, and computing the hash would waste a pass over it.
    public var signsChecksummedPayloads: Bool { (self.endpoint.url.scheme ?? "http") != "https" }
    let signer: SigV4Signer
    let http: HTTPClient
    let timeout: TimeAmount
    let clock: @Sendable () -> Date
    /// The most bytes read of an answer that is not an object (XML of a listing or an error).
    static let maxAnswerBytes = 8 << 20

    public init(
        endpoint: S3Endpoint, credentials: S3Credentials, http: HTTPClient, timeout: TimeAmount = .seconds(60),
        clock: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.endpoint = endpoint
        self.signer = SigV4Signer(credentials: credentials, region: endpoint.region)
        self.http = http
        self.timeout = timeout
        self.clock = clock
    }

    // MARK: Buckets

    /// Creates `bucket`; one that exists already and is ours is fine.
    public func createBucket(_ bucket: String) async throws {
        let answer = try await self.send("CreateBucket", bucket: bucket, key: nil, method: .PUT, accept: [200, 409])
        if answer.status == 409, S3XML.value(of: "Code", in: answer.body) != "BucketAlreadyOwnedByYou" {
            throw self.error("CreateBucket", bucket: bucket, key: nil, answer)
        }
    }

    /// Deletes `bucket`, which must be empty; one already gone is fine.
    public func deleteBucket(_ bucket: String) async throws {
        _ = try await self.send("DeleteBucket", bucket: bucket, key: nil, method: .DELETE, accept: [200, 204, 404])
    }

    // MARK: Objects

    /// Stores `body` as `key` in one request. With `ifNoneMatch`, refuses (``S3Error/isPreconditionFailed``) when the key
    /// holds an object already. `sha1` (base64) makes the server check the bytes. Returns the ETag.
    @discardableResult
    public func putObject(
        bucket: String, key: String, body: ByteBuffer, sha1: String? = nil, ifNoneMatch: Bool = false
    ) async throws -> String {
        try await self.putObject(bucket: bucket, key: key, body: .bytes(body), sha1: sha1, ifNoneMatch: ifNoneMatch)
    }

    /// ``putObject(bucket:key:body:sha1:ifNoneMatch:)`` with the body read from a file as it is sent.
    @discardableResult
    public func putObject(
        bucket: String, key: String, body: S3Body, sha1: String? = nil, ifNoneMatch: Bool = false
    ) async throws -> String {
        var headers: [(name: String, value: String)] = [("content-type", "application/octet-stream")]
        if let sha1 { headers.append(("x-amz-checksum-sha1", sha1)) }
        if ifNoneMatch { headers.append(("if-none-match", "*")) }
        let answer = try await self.send("PutObject", bucket: bucket, key: key, method: .PUT, headers: headers, body: body)
        return answer.headers.first(name: "etag") ?? ""
    }

    /// HEAD: the object's size and ETag, or nil when there is none.
    public func headObject(bucket: String, key: String) async throws -> S3ObjectInfo? {
        let answer = try await self.send(
            "HeadObject", bucket: bucket, key: key, method: .HEAD, headers: [("x-amz-checksum-mode", "ENABLED")], accept: [200, 404]
        )
        guard answer.status == 200 else { return nil }
        guard let length = answer.headers.first(name: "content-length").flatMap({ Int64($0) }) else {
            throw S3Error(
                operation: "HeadObject", bucket: bucket, key: key, status: answer.status, code: "NoContentLength",
                message: "the answer has no Content-Length", requestID: answer.headers.first(name: "x-amz-request-id")
            )
        }
        return S3ObjectInfo(
            size: length, etag: answer.headers.first(name: "etag") ?? "", checksumSHA1: answer.headers.first(name: "x-amz-checksum-sha1")
        )
    }

    /// The object's bytes, or those of `range` (inclusive offsets), at most `maxBytes`.
    public func getObject(bucket: String, key: String, range: ClosedRange<Int64>? = nil, maxBytes: Int) async throws -> ByteBuffer {
        var headers: [(name: String, value: String)] = []
        if let range { headers.append(("range", "bytes=\(range.lowerBound)-\(range.upperBound)")) }
        let answer = try await self.send(
            "GetObject", bucket: bucket, key: key, method: .GET, headers: headers, accept: [200, 206], maxAnswer: maxBytes
        )
        return answer.body
    }

    /// Copies `source` to `key` on the server (no bytes through the client). With `ifNoneMatch`, refuses when `key`
    /// holds an object already.
    public func copyObject(
        bucket: String, from source: String, to key: String, ifNoneMatch: Bool = false, sourceETag: String? = nil
    ) async throws {
        var headers: [(name: String, value: String)] = [
            ("x-amz-copy-source", "/\(bucket)/" + SigV4Signer.uriEncode(source, keepSlash: true))
        ]
        // Only if the source is still the object looked at (its ETag): never copy bytes no one verified.
        if let sourceETag { headers.append(("x-amz-copy-source-if-match", sourceETag)) }
        if ifNoneMatch { headers.append(("if-none-match", "*")) }
        let answer = try await self.send("CopyObject", bucket: bucket, key: key, method: .PUT, headers: headers)
        // A copy can fail after the 200 went out: the error is then in the body.
        if S3XML.value(of: "Code", in: answer.body) != nil { throw self.error("CopyObject", bucket: bucket, key: key, answer) }
    }

    /// Deletes `key`; a missing key is fine.
    public func deleteObject(bucket: String, key: String) async throws {
        _ = try await self.send("DeleteObject", bucket: bucket, key: key, method: .DELETE, accept: [200, 204, 404])
    }

    /// The keys under `prefix`, all of them (ListObjectsV2, page by page).
    public func listObjects(bucket: String, prefix: String) async throws -> [(key: String, size: Int64)] {
        var found: [(key: String, size: Int64)] = []
        var token: String? = nil
        repeat {
            var query: [(name: String, value: String)] = [("list-type", "2"), ("prefix", prefix)]
            if let token { query.append(("continuation-token", token)) }
            let answer = try await self.send("ListObjectsV2", bucket: bucket, key: nil, method: .GET, query: query)
            for item in S3XML.elements("Contents", in: answer.body) {
                guard let key = S3XML.value(of: "Key", in: item) else { continue }
                found.append((key, S3XML.value(of: "Size", in: item).flatMap { Int64($0) } ?? 0))
            }
            token = S3XML.value(of: "IsTruncated", in: answer.body) == "true" ? S3XML.value(of: "NextContinuationToken", in: answer.body) : nil
        } while token != nil
        return found
    }

    // MARK: Multipart uploads

    /// Starts a multipart upload of `key`; with `sha1Checksums` every part must carry its SHA-1. Returns the upload id.
    public func createMultipartUpload(bucket: String, key: String, sha1Checksums: Bool = false) async throws -> String {
        var headers: [(name: String, value: String)] = [("content-type", "application/octet-stream")]
        if sha1Checksums { headers.append(("x-amz-checksum-algorithm", "SHA1")) }
        let answer = try await self.send(
            "CreateMultipartUpload", bucket: bucket, key: key, method: .POST, query: [("uploads", "")], headers: headers
        )
        guard let id = S3XML.value(of: "UploadId", in: answer.body), !id.isEmpty else {
            throw S3Error(
                operation: "CreateMultipartUpload", bucket: bucket, key: key, status: answer.status, code: "NoUploadId",
                message: "the answer names no upload", requestID: answer.headers.first(name: "x-amz-request-id")
            )
        }
        return id
    }

    /// Uploads part `number` (1...10,000) of the upload; `sha1` (base64) is checked by the server. Returns the part.
    public func uploadPart(
        bucket: String, key: String, uploadID: String, number: Int, body: ByteBuffer, sha1: String? = nil
    ) async throws -> S3Part {
        try await self.uploadPart(bucket: bucket, key: key, uploadID: uploadID, number: number, body: .bytes(body), sha1: sha1)
    }

    /// ``uploadPart(bucket:key:uploadID:number:body:sha1:)`` with the body read from a file as it is sent.
    public func uploadPart(
        bucket: String, key: String, uploadID: String, number: Int, body: S3Body, sha1: String? = nil
    ) async throws -> S3Part {
        var headers: [(name: String, value: String)] = []
        if let sha1 { headers.append(("x-amz-checksum-sha1", sha1)) }
        let answer = try await self.send(
            "UploadPart", bucket: bucket, key: key, method: .PUT, query: [("partNumber", "\(number)"), ("uploadId", uploadID)],
            headers: headers, body: body
        )
        guard let etag = answer.headers.first(name: "etag") else {
            throw S3Error(
                operation: "UploadPart", bucket: bucket, key: key, status: answer.status, code: "NoETag",
                message: "part \(number) has no ETag", requestID: answer.headers.first(name: "x-amz-request-id")
            )
        }
        return S3Part(number: number, etag: etag, checksumSHA1: sha1)
    }

    /// Makes the parts, in order, the object `key`. With `ifNoneMatch`, refuses when `key` holds an object already.
    public func completeMultipartUpload(
        bucket: String, key: String, uploadID: String, parts: [S3Part], ifNoneMatch: Bool = false
    ) async throws {
        var xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        for part in parts.sorted(by: { $0.number < $1.number }) {
            xml += "<Part><PartNumber>\(part.number)</PartNumber><ETag>\(S3XML.escape(part.etag))</ETag>"
            if let sha1 = part.checksumSHA1 { xml += "<ChecksumSHA1>\(S3XML.escape(sha1))</ChecksumSHA1>" }
            xml += "</Part>"
        }
        xml += "</CompleteMultipartUpload>"
        var headers: [(name: String, value: String)] = [("content-type", "application/xml")]
        if ifNoneMatch { headers.append(("if-none-match", "*")) }
        let answer = try await self.send(
            "CompleteMultipartUpload", bucket: bucket, key: key, method: .POST, query: [("uploadId", uploadID)], headers: headers,
            body: ByteBuffer(string: xml)
        )
        // S3 may answer 200 and then fail: the error is in the body.
        if S3XML.value(of: "Code", in: answer.body) != nil {
            throw self.error("CompleteMultipartUpload", bucket: bucket, key: key, answer)
        }
    }

    /// Gives up the upload and its parts; one already gone is fine.
    public func abortMultipartUpload(bucket: String, key: String, uploadID: String) async throws {
        _ = try await self.send(
            "AbortMultipartUpload", bucket: bucket, key: key, method: .DELETE, query: [("uploadId", uploadID)], accept: [200, 204, 404]
        )
    }

    /// The parts uploaded so far (ListParts, page by page), by number.
    public func listParts(bucket: String, key: String, uploadID: String) async throws -> [(part: S3Part, size: Int64)] {
        var found: [(part: S3Part, size: Int64)] = []
        var marker: String? = nil
        repeat {
            var query: [(name: String, value: String)] = [("uploadId", uploadID)]
            if let marker { query.append(("part-number-marker", marker)) }
            let answer = try await self.send("ListParts", bucket: bucket, key: key, method: .GET, query: query)
            for item in S3XML.elements("Part", in: answer.body) {
                guard let number = S3XML.value(of: "PartNumber", in: item).flatMap({ Int($0) }),
                    let etag = S3XML.value(of: "ETag", in: item)
                else { continue }
                found.append(
                    (
                        S3Part(number: number, etag: etag, checksumSHA1: S3XML.value(of: "ChecksumSHA1", in: item)),
                        S3XML.value(of: "Size", in: item).flatMap { Int64($0) } ?? 0
                    )
                )
            }
            marker = S3XML.value(of: "IsTruncated", in: answer.body) == "true" ? S3XML.value(of: "NextPartNumberMarker", in: answer.body) : nil
        } while marker != nil
        return found.sorted { $0.part.number < $1.part.number }
    }

    /// The multipart uploads under `prefix` not completed nor aborted: key, upload id and when each began.
    public func listMultipartUploads(bucket: String, prefix: String) async throws -> [(key: String, uploadID: String, initiated: String)] {
        var found: [(key: String, uploadID: String, initiated: String)] = []
        var markers: (key: String, id: String)? = nil
        repeat {
            var query: [(name: String, value: String)] = [("uploads", ""), ("prefix", prefix)]
            if let markers { query += [("key-marker", markers.key), ("upload-id-marker", markers.id)] }
            let answer = try await self.send("ListMultipartUploads", bucket: bucket, key: nil, method: .GET, query: query)
            for item in S3XML.elements("Upload", in: answer.body) {
                guard let key = S3XML.value(of: "Key", in: item), let id = S3XML.value(of: "UploadId", in: item) else { continue }
                found.append((key, id, S3XML.value(of: "Initiated", in: item) ?? ""))
            }
            if S3XML.value(of: "IsTruncated", in: answer.body) == "true",
                let key = S3XML.value(of: "NextKeyMarker", in: answer.body), let id = S3XML.value(of: "NextUploadIdMarker", in: answer.body)
            {
                markers = (key, id)
            } else {
                markers = nil
            }
        } while markers != nil
        return found
    }

    // MARK: The request

    struct Answer {
        var status: Int
        var headers: HTTPHeaders
        var body: ByteBuffer
    }

    /// Signs and sends one request; an answer outside `accept` becomes an ``S3Error``.
    func send(
        _ operation: String, bucket: String, key: String?, method: HTTPMethod, query: [(name: String, value: String)] = [],
        headers: [(name: String, value: String)] = [], body: ByteBuffer? = nil, accept: Set<Int> = [200, 204],
        maxAnswer: Int = S3Client.maxAnswerBytes
    ) async throws -> Answer {
        try await self.send(
            operation, bucket: bucket, key: key, method: method, query: query, headers: headers, body: body.map { .bytes($0) },
            accept: accept, maxAnswer: maxAnswer
        )
    }

    func send(
        _ operation: String, bucket: String, key: String?, method: HTTPMethod, query: [(name: String, value: String)] = [],
        headers: [(name: String, value: String)] = [], body: S3Body?, accept: Set<Int> = [200, 204],
        maxAnswer: Int = S3Client.maxAnswerBytes
    ) async throws -> Answer {
        let path = "/" + bucket + (key.map { "/" + $0 } ?? "")
        let encodedPath = SigV4Signer.uriEncode(path, keepSlash: true)
        let encodedQuery = query.map { SigV4Signer.uriEncode($0.name, keepSlash: false) + "=" + SigV4Signer.uriEncode($0.value, keepSlash: false) }
            .joined(separator: "&")
        let url = self.endpoint.url
        let scheme = url.scheme ?? "http"
        // An IPv6 address goes in brackets, in the Host header as in the URL.
        let host = url.host.map { $0.contains(":") && !$0.hasPrefix("[") ? "[\($0)]" : $0 } ?? "127.0.0.1"
        let defaultPort = scheme == "https" ? 443 : 80
        let hostHeader = url.port.map { $0 == defaultPort ? host : "\(host):\($0)" } ?? host
        let base = "\(scheme)://\(hostHeader)"

        var signed = headers
        signed.append(("host", hostHeader))
        let unsigned = scheme == "https" && body != nil && headers.contains { $0.name == "x-amz-checksum-sha1" }
        let payloadHash: String
        switch body {
        case _ where unsigned: payloadHash = SigV4Signer.unsignedPayload
        case .bytes(let buffer)?: payloadHash = Self.sha256Hex(buffer)
        case .file(_, _, _, let sha256)?: payloadHash = sha256
        case nil: payloadHash = Self.sha256Hex(ByteBuffer())
        }
        let signature = self.signer.sign(
            SigV4Signer.Request(method: method.rawValue, path: path, query: query, headers: signed, payloadHash: payloadHash),
            at: self.clock()
        )

        var request = HTTPClientRequest(url: base + encodedPath + (encodedQuery.isEmpty ? "" : "?" + encodedQuery))
        request.method = method
        for (name, value) in signed + signature.headers { request.headers.add(name: name, value: value) }
        switch body {
        case .bytes(let buffer)?:
            request.body = .bytes(buffer)
        case .file(let descriptor, let offset, let length, _)?:
            request.body = .stream(FileRangeSequence(descriptor: descriptor, offset: offset, length: length), length: .known(length))
        case nil where method == .PUT || method == .POST:
            request.body = .bytes(ByteBuffer())
        case nil:
            break
        }

        let response: HTTPClientResponse
        do {
            // The deadline grows with the body: a part of hundreds of MiB on a slow link is not a hung request.
            let timeout = self.timeout + .seconds((body?.length ?? 0) / (1 << 20))
            response = try await self.http.execute(request, timeout: timeout)
        } catch {
            throw S3Error(
                operation: operation, bucket: bucket, key: key, status: 0, code: "NoAnswer",
                message: "\(self.endpoint.url.absoluteString): \(error)", requestID: nil
            )
        }
        let status = Int(response.status.code)
        let limit = accept.contains(status) ? maxAnswer : Self.maxAnswerBytes
        let answer = Answer(
            status: status, headers: response.headers, body: method == .HEAD ? ByteBuffer() : try await response.body.collect(upTo: limit)
        )
        guard accept.contains(status) else { throw self.error(operation, bucket: bucket, key: key, answer) }
        return answer
    }

    static func sha256Hex(_ buffer: ByteBuffer) -> String {
        var hasher = SHA256()
        buffer.withUnsafeReadableBytes { hasher.update($0) }
        return SigV4Signer.hex(hasher.finalize())
    }

    func error(_ operation: String, bucket: String, key: String?, _ answer: Answer) -> S3Error {
        S3Error(
            operation: operation, bucket: bucket, key: key, status: answer.status,
            code: S3XML.value(of: "Code", in: answer.body) ?? HTTPResponseStatus(statusCode: answer.status).reasonPhrase,
            message: S3XML.value(of: "Message", in: answer.body) ?? "",
            requestID: answer.headers.first(name: "x-amz-request-id") ?? S3XML.value(of: "RequestId", in: answer.body)
        )
    }
}

/// A range of a file as an async sequence of buffers of at most 1 MiB, read as the request body is sent.
struct FileRangeSequence: AsyncSequence, Sendable {
    typealias Element = ByteBuffer
    let descriptor: Int32
    let offset: Int64
    let length: Int64
    static let pieceBytes = 1 << 20

    struct AsyncIterator: AsyncIteratorProtocol {
        let descriptor: Int32
        var offset: Int64
        var left: Int64

        mutating func next() async throws -> ByteBuffer? {
            guard self.left > 0 else { return nil }
            let want = Int(Swift.min(Int64(FileRangeSequence.pieceBytes), self.left))
            var buffer = ByteBufferAllocator().buffer(capacity: want)
            let (descriptor, offset) = (self.descriptor, self.offset)
            let got = try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: want) { raw -> Int in
                guard let base = raw.baseAddress else { return 0 }
                var done = 0
                while done < want {
                    let n = pread(descriptor, base + done, want - done, off_t(offset) + off_t(done))
                    if n < 0 && errno == EINTR { continue }
                    guard n > 0 else { throw FileRangeError(description: "the file ends \(done) bytes into a read of \(want) at \(offset)") }
                    done += n
                }
                return done
            }
            self.offset += Int64(got)
            self.left -= Int64(got)
            return buffer
        }
    }

    func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(descriptor: self.descriptor, offset: self.offset, left: self.length)
    }
}

struct FileRangeError: Error, CustomStringConvertible {
    var description: String
}
