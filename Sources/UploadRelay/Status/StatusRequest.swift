import Foundation
import UploadProtocol

/// A request to the status endpoint (an account's uploads in progress, visible to its other clients), read from its
/// method, URI and `Authorization` headers alone, with no I/O: what ``StatusResponder`` answers.
///
/// - `GET /v1/status?key=KEY`: that key of the token's account.
/// - `GET /v1/status?prefix=P&after=K&limit=N`: a page of its keys starting with P (all when absent), in the UTF-8
///   byte order of the keys, after K, at most N.
///
/// Values are percent-encoded (RFC 3986; `+` is a plus sign, not a space). HEAD is answered as GET, without a body.
public struct StatusRequest: Hashable, Sendable {
    public enum Query: Hashable, Sendable {
        case key(String)
        case list(prefix: String, after: String?, limit: Int)
    }

    /// The bearer token, as sent.
    public var token: String
    public var query: Query
    /// HEAD: the answer's headers only.
    public var headOnly: Bool

    public static let path = "/v1/status"
    /// The longest token looked up (ours are 47 characters).
    public static let maxTokenLength = 256

    /// Reads a request; the error is the answer to give instead.
    public static func parse(method: String, uri: String, authorization: [String], maxListed: Int) throws(StatusRefusal) -> StatusRequest {
        guard method == "GET" || method == "HEAD" else {
            throw StatusRefusal(.methodNotAllowed, "\(method) is not served: the status endpoint is read-only (GET or HEAD)")
        }
        // Read by hand: Foundation's URLComponents re-encodes a stray "%" on Linux rather than refuse it.
        let (path, query) = uri.firstIndex(of: "?").map { (String(uri[..<$0]), String(uri[uri.index(after: $0)...])) } ?? (uri, "")
        guard path == Self.path || path == Self.path + "/" else {
            throw StatusRefusal(
                .notFound, "nothing is served at \(path.prefix(200)): ask GET \(Self.path)?key=KEY, or \(Self.path)?prefix=PREFIX for a listing")
        }
        var parameters: [String: String] = [:]
        for item in query.split(separator: "&", omittingEmptySubsequences: true) {
            let name = String(item.prefix { $0 != "=" })
            guard ["key", "prefix", "after", "limit"].contains(name) else {
                throw StatusRefusal(
                    .badRequest, "unknown parameter \"\(name.prefix(100))\": the status endpoint takes key, or prefix, after and limit")
            }
            guard parameters[name] == nil else {
                throw StatusRefusal(.badRequest, "parameter \"\(name)\" is given twice")
            }
            guard let value = Self.percentDecoded(String(item.dropFirst(name.count + 1))) else {
                throw StatusRefusal(.badRequest, "parameter \"\(name)\" is not percent-encoded UTF-8 (RFC 3986)")
            }
            // No key holds a control byte (SPEC §12.2): a prefix or a start with one names nothing, and a catalog may
            // read a NUL as the end of the text.
            if let control = value.utf8.first(where: { $0 < 0x20 || $0 == 0x7F }) {
                throw StatusRefusal(
                    .badRequest, "parameter \"\(name)\" holds the control byte 0x\(String(control, radix: 16)), which no key holds"
                )
            }
            parameters[name] = value
        }
        let token = try Self.bearer(authorization)
        if let key = parameters["key"] {
            guard parameters.count == 1 else {
                throw StatusRefusal(.badRequest, "key names one key: it does not go with prefix, after or limit")
            }
            do {
                _ = try ObjectKey(validating: key)
            } catch {
                throw StatusRefusal(.badRequest, "key \"\(key)\" cannot name an object: \(error.reason)")
            }
            return StatusRequest(token: token, query: .key(key), headOnly: method == "HEAD")
        }
        var limit = maxListed
        if let text = parameters["limit"] {
            guard let value = Int(text), (1...maxListed).contains(value) else {
                throw StatusRefusal(.badRequest, "limit \"\(text)\" must be a number from 1 to \(maxListed)")
            }
            limit = value
        }
        let after = parameters["after"].flatMap { $0.isEmpty ? nil : $0 }
        return StatusRequest(token: token, query: .list(prefix: parameters["prefix"] ?? "", after: after, limit: limit), headOnly: method == "HEAD")
    }

    /// `text` with each `%XX` made the byte it names, when those bytes are UTF-8; nil when a `%` is not followed by two
    /// hex digits or the bytes are not UTF-8.
    static func percentDecoded(_ text: String) -> String? {
        var bytes: [UInt8] = []
        var input = text.utf8.makeIterator()
        while let byte = input.next() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard let high = input.next().flatMap(Self.hexValue), let low = input.next().flatMap(Self.hexValue) else { return nil }
            bytes.append(high << 4 | low)
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// The token of the one `Authorization: Bearer TOKEN` header.
    static func bearer(_ authorization: [String]) throws(StatusRefusal) -> String {
        guard let header = authorization.first else {
            throw StatusRefusal(.unauthorized, "send the account's token: Authorization: Bearer TOKEN (the token the agent uses)")
        }
        guard authorization.count == 1 else {
            throw StatusRefusal(.badRequest, "send one Authorization header, not \(authorization.count)")
        }
        let parts = header.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else {
            throw StatusRefusal(.unauthorized, "the Authorization header must be \"Bearer TOKEN\"")
        }
        let token = parts[1].trimmingCharacters(in: .whitespaces)
        guard !token.isEmpty, token.utf8.count <= Self.maxTokenLength else {
            throw StatusRefusal(.unauthorized, "the token is not one this relay gives (upload-relay token add)")
        }
        return token
    }
}

/// A status request answered with an error: the HTTP status and what was wrong, in words (the JSON `error`).
public struct StatusRefusal: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: Int, Hashable, Sendable {
        case badRequest = 400
        case unauthorized = 401
        case notFound = 404
        case methodNotAllowed = 405
        case payloadTooLarge = 413
        case unavailable = 503
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(self.code.rawValue): \(self.message)" }
}
