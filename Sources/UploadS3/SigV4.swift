import UploadChecksums
import Foundation

/// An S3 access key: the pair every request is signed with, and the session token of temporary credentials.
public struct S3Credentials: Sendable, Hashable {
    public var accessKeyID: String
    public var secretAccessKey: String
    /// Sent as `x-amz-security-token` (and signed) when set: credentials from STS or an instance role.
    public var sessionToken: String?

    public init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil) {
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
    }
}

/// AWS Signature Version 4 for S3 requests, in headers (the `Authorization` header, not a presigned URL).
///
/// No I/O, and the clock is passed in: tests sign with a fixed time and compare with botocore's signatures of the
/// same requests (`Tests/UploadS3Tests/Fixtures/sigv4-vectors.json`, made by `tools/s3/sigv4_vectors.py`).
///
/// The rules, from AWS's "Create a signed AWS API request":
/// - the path is URI-encoded segment by segment (S3 paths are not normalized: `a//b` and `./` stay as they are);
/// - query parameters are encoded, sorted by name then value, and always written `name=value`, an empty value
///   included (`uploads=`: some servers refuse the signature of a bare `uploads`);
/// - header names lowercase, values trimmed with inner runs of spaces made one, sorted by name;
/// - `x-amz-content-sha256` carries the payload's SHA-256 in hex, or `UNSIGNED-PAYLOAD`, and is signed.
public struct SigV4Signer: Sendable {
    public var credentials: S3Credentials
    public var region: String
    public var service: String

    /// The payload hash that leaves the body unsigned (over TLS, with a checksum header beside it).
    public static let unsignedPayload = "UNSIGNED-PAYLOAD"

    public init(credentials: S3Credentials, region: String, service: String = "s3") {
        self.credentials = credentials
        self.region = region
        self.service = service
    }

    /// A request as it is signed: the path is the raw (decoded) one, the query raw names and values.
    public struct Request: Sendable {
        public var method: String
        /// The path, decoded (`/bucket/a key`); encoded here.
        public var path: String
        /// Query parameters, decoded; `("uploads", "")` is written `uploads=`.
        public var query: [(name: String, value: String)]
        /// Headers sent, `host` among them. Signing adds `x-amz-date`, `x-amz-content-sha256` and, with a session
        /// token, `x-amz-security-token`.
        public var headers: [(name: String, value: String)]
        /// The hex SHA-256 of the body, or ``SigV4Signer/unsignedPayload``.
        public var payloadHash: String

        public init(
            method: String, path: String, query: [(name: String, value: String)] = [], headers: [(name: String, value: String)],
            payloadHash: String
        ) {
            self.method = method
            self.path = path
            self.query = query
            self.headers = headers
            self.payloadHash = payloadHash
        }
    }

    /// What signing produced: the headers to add, and the steps, for tests and for logs when a server refuses.
    public struct Signature: Sendable {
        /// `authorization`, `x-amz-date`, `x-amz-content-sha256` (and `x-amz-security-token`), to send.
        public var headers: [(name: String, value: String)]
        public var canonicalRequest: String
        public var stringToSign: String
        public var signature: String
    }

    /// Signs `request` at `date`.
    public func sign(_ request: Request, at date: Date) -> Signature {
        let (amzDate, day) = Self.timestamps(date)
        var headers = request.headers
        headers.append(("x-amz-date", amzDate))
        headers.append(("x-amz-content-sha256", request.payloadHash))
        if let token = self.credentials.sessionToken { headers.append(("x-amz-security-token", token)) }

        let canonicalHeaders = Self.canonicalHeaders(headers)
        let signedHeaders = canonicalHeaders.map(\.name).joined(separator: ";")
        let canonicalRequest = [
            request.method,
            Self.canonicalPath(request.path),
            Self.canonicalQuery(request.query),
            canonicalHeaders.map { "\($0.name):\($0.value)\n" }.joined(),
            signedHeaders,
            request.payloadHash,
        ].joined(separator: "\n")
        let scope = "\(day)/\(self.region)/\(self.service)/aws4_request"
        let stringToSign = [
            "AWS4-HMAC-SHA256", amzDate, scope, Self.hex(SHA256.hash(canonicalRequest.utf8)),
        ].joined(separator: "\n")

        var key = Array("AWS4\(self.credentials.secretAccessKey)".utf8)
        for part in [day, self.region, self.service, "aws4_request"] {
            key = HMACSHA256.authenticationCode(for: Array(part.utf8), key: key)
        }
        let signature = Self.hex(HMACSHA256.authenticationCode(for: Array(stringToSign.utf8), key: key))

        var added: [(name: String, value: String)] = [
            (
                "authorization",
                "AWS4-HMAC-SHA256 Credential=\(self.credentials.accessKeyID)/\(scope), SignedHeaders=\(signedHeaders), Signature=\(signature)"
            ),
            ("x-amz-date", amzDate),
            ("x-amz-content-sha256", request.payloadHash),
        ]
        if let token = self.credentials.sessionToken { added.append(("x-amz-security-token", token)) }
        return Signature(headers: added, canonicalRequest: canonicalRequest, stringToSign: stringToSign, signature: signature)
    }

    /// The hex SHA-256 of `bytes`, for ``Request/payloadHash``.
    public static func payloadHash<Bytes: Sequence>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        var hasher = SHA256()
        hasher.update(bytes)
        return Self.hex(hasher.finalize())
    }

    /// `20261125T101500Z` and `20261125`, in UTC.
    static func timestamps(_ date: Date) -> (amzDate: String, day: String) {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC") ?? calendar.timeZone
        let c = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
        func two(_ value: Int?) -> String {
            let v = value ?? 0
            return v < 10 ? "0\(v)" : "\(v)"
        }
        let day = "\(c.year ?? 1970)\(two(c.month))\(two(c.day))"
        return ("\(day)T\(two(c.hour))\(two(c.minute))\(two(c.second))Z", day)
    }

    /// Lowercase names, values trimmed and inner runs of spaces made one, sorted by name; a header given twice has
    /// its values joined with commas, in the order given.
    static func canonicalHeaders(_ headers: [(name: String, value: String)]) -> [(name: String, value: String)] {
        var merged: [String: [String]] = [:]
        for (name, value) in headers {
            let trimmed = value.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
            merged[name.lowercased(), default: []].append(trimmed)
        }
        return merged.keys.sorted().map { ($0, merged[$0, default: []].joined(separator: ",")) }
    }

    /// Each segment URI-encoded, `/` kept (S3 does not normalize paths).
    static func canonicalPath(_ path: String) -> String {
        let encoded = Self.uriEncode(path, keepSlash: true)
        return encoded.isEmpty ? "/" : encoded
    }

    /// Names and values encoded, sorted by name then value, each written `name=value`.
    static func canonicalQuery(_ query: [(name: String, value: String)]) -> String {
        query.map { (Self.uriEncode($0.name, keepSlash: false), Self.uriEncode($0.value, keepSlash: false)) }
            .sorted { $0.0 != $1.0 ? $0.0 < $1.0 : $0.1 < $1.1 }
            .map { "\($0.0)=\($0.1)" }
            .joined(separator: "&")
    }

    /// RFC 3986 encoding as SigV4 wants it: unreserved characters (`A-Z a-z 0-9 - . _ ~`) kept, every other byte of the
    /// UTF-8 as `%XX` in uppercase hex; `/` kept in paths.
    public static func uriEncode(_ string: String, keepSlash: Bool) -> String {
        var out = ""
        out.reserveCapacity(string.utf8.count)
        for byte in string.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: "/") where keepSlash:
                out.append("/")
            default:
                out.append("%")
                out.append(Self.hexDigits[Int(byte >> 4)])
                out.append(Self.hexDigits[Int(byte & 0xF)])
            }
        }
        return out
    }

    private static let hexDigits: [Character] = Array("0123456789ABCDEF")

    static func hex<D: Sequence>(_ digest: D) -> String where D.Element == UInt8 {
        let digits = Array("0123456789abcdef")
        var out = ""
        for byte in digest {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return out
    }
}

extension S3Credentials {
    /// The usual places, in the usual order: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and
    /// `AWS_SESSION_TOKEN`), else the profile `AWS_PROFILE` (default `default`) of the shared credentials file
    /// (`AWS_SHARED_CREDENTIALS_FILE`, default `~/.aws/credentials`). Nil when neither has a key; a file that names the
    /// profile without both keys is an error that says so.
    public static func load(environment: [String: String]) throws -> S3Credentials? {
        if let id = environment["AWS_ACCESS_KEY_ID"], let secret = environment["AWS_SECRET_ACCESS_KEY"], !id.isEmpty, !secret.isEmpty {
            return S3Credentials(
                accessKeyID: id, secretAccessKey: secret, sessionToken: environment["AWS_SESSION_TOKEN"].flatMap { $0.isEmpty ? nil : $0 })
        }
        let home = environment["HOME"] ?? NSHomeDirectory()
        let path = environment["AWS_SHARED_CREDENTIALS_FILE"] ?? home + "/.aws/credentials"
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        let profile = environment["AWS_PROFILE"] ?? "default"
        guard let values = Self.profile(profile, in: text) else { return nil }
        guard let id = values["aws_access_key_id"], let secret = values["aws_secret_access_key"] else {
            throw CredentialsError(description: "\(path): profile [\(profile)] lacks aws_access_key_id or aws_secret_access_key")
        }
        return S3Credentials(accessKeyID: id, secretAccessKey: secret, sessionToken: values["aws_session_token"])
    }

    /// The `key = value` lines of `[name]` in an INI text (comments with `#` or `;`), nil when there is no such section.
    static func profile(_ name: String, in text: String) -> [String: String]? {
        var values: [String: String]? = nil
        var inside = false
        for raw in text.split(whereSeparator: \.isNewline) {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                inside = line.dropFirst().dropLast().trimmingCharacters(in: .whitespaces) == name
                if inside && values == nil { values = [:] }
                continue
            }
            guard inside, let equals = line.firstIndex(of: "=") else { continue }
            let key = line[..<equals].trimmingCharacters(in: .whitespaces).lowercased()
            values?[key] = line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
        }
        return values
    }
}

/// Credentials that were found but cannot be used.
public struct CredentialsError: Error, CustomStringConvertible, Sendable {
    public var description: String
}
