import Foundation
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay

/// The status endpoint's requests, read without I/O: what is answered, and what is refused with which status.
@Suite("Status endpoint: requests")
struct StatusRequestTests {
    static let bearer = ["Bearer upl_token"]

    static func parse(_ uri: String, method: String = "GET", authorization: [String] = bearer) throws(StatusRefusal) -> StatusRequest {
        try StatusRequest.parse(method: method, uri: uri, authorization: authorization, maxListed: 50)
    }

    @Test("a key, a listing, HEAD; values percent-decoded, + kept a plus")
    func accepted() async throws {
        #expect(try Self.parse("/v1/status?key=photos/a%20b%2Bc+d.jpg").query == .key("photos/a b+c+d.jpg"))
        #expect(try Self.parse("/v1/status?key=%C3%A9t%C3%A9.jpg").query == .key("été.jpg"))
        #expect(try Self.parse("/v1/status/?key=x").query == .key("x"))
        #expect(try Self.parse("/v1/status").query == .list(prefix: "", after: nil, limit: 50))
        #expect(try Self.parse("/v1/status?prefix=a%2F&after=a/b&limit=7").query == .list(prefix: "a/", after: "a/b", limit: 7))
        #expect(try Self.parse("/v1/status?prefix=&after=&").query == .list(prefix: "", after: nil, limit: 50))
        let head = try Self.parse("/v1/status?key=x", method: "HEAD")
        #expect(head.headOnly && head.token == "upl_token")
        #expect(try Self.parse("/v1/status?key=x", authorization: ["bearer   upl_x "]).token == "upl_x")
    }

    @Test(
        "refused with the status that says why",
        arguments: [
            ("POST", "/v1/status?key=x", bearer, StatusRefusal.Code.methodNotAllowed),
            ("DELETE", "/v1/status?key=x", bearer, .methodNotAllowed),
            ("GET", "/v1/other", bearer, .notFound),
            ("GET", "/", bearer, .notFound),
            ("GET", "*", bearer, .notFound),
            ("GET", "/v1/status?key=x&key=y", bearer, .badRequest),
            ("GET", "/v1/status?key=x&prefix=y", bearer, .badRequest),
            ("GET", "/v1/status?key=x&limit=1", bearer, .badRequest),
            ("GET", "/v1/status?bogus=1", bearer, .badRequest),
            ("GET", "/v1/status?key=%zz", bearer, .badRequest),
            ("GET", "/v1/status?key=%4", bearer, .badRequest),
            ("GET", "/v1/status?key=%FF", bearer, .badRequest),
            ("GET", "/v1/status?key=", bearer, .badRequest),
            ("GET", "/v1/status?key=../etc/passwd", bearer, .badRequest),
            ("GET", "/v1/status?key=/abs", bearer, .badRequest),
            ("GET", "/v1/status?key=a%00b", bearer, .badRequest),
            // A control byte in a listing's prefix or start: no key holds one (a NUL listed a whole account on SQLite).
            ("GET", "/v1/status?prefix=a%00b", bearer, .badRequest),
            ("GET", "/v1/status?prefix=%00", bearer, .badRequest),
            ("GET", "/v1/status?after=a%0Ab", bearer, .badRequest),
            ("GET", "/v1/status?prefix=x%7F", bearer, .badRequest),
            ("GET", "/v1/status?limit=0", bearer, .badRequest),
            ("GET", "/v1/status?limit=51", bearer, .badRequest),
            ("GET", "/v1/status?limit=-1", bearer, .badRequest),
            ("GET", "/v1/status?limit=99999999999999999999999", bearer, .badRequest),
            ("GET", "/v1/status?key=x", [], .unauthorized),
            ("GET", "/v1/status?key=x", ["Basic dXNlcjpwYXNz"], .unauthorized),
            ("GET", "/v1/status?key=x", ["Bearer"], .unauthorized),
            ("GET", "/v1/status?key=x", ["Bearer " + String(repeating: "t", count: 257)], .unauthorized),
            ("GET", "/v1/status?key=x", ["Bearer a", "Bearer b"], .badRequest),
        ] as [(String, String, [String], StatusRefusal.Code)]
    )
    func refused(method: String, uri: String, authorization: [String], code: StatusRefusal.Code) async {
        #expect(throws: StatusRefusal.self) { try Self.parse(uri, method: method, authorization: authorization) }
        do {
            _ = try Self.parse(uri, method: method, authorization: authorization)
        } catch {
            #expect(error.code == code, "\(method) \(uri) \(authorization): \(error)")
            #expect(!error.message.isEmpty)
        }
    }

    @Test("random URIs never trap, and every valid key, percent-encoded at random, reads back as itself", arguments: [21, 22, 23] as [UInt64])
    func random(seed: UInt64) async {
        var rng = SeededGenerator(seed: seed)
        let alphabet = Array("ab/%?&=+.é _-0F\u{7f}\\".unicodeScalars)
        for _ in 0..<2000 {
            let length = Int(rng.next() % 40)
            let text = String(String.UnicodeScalarView((0..<length).map { _ in alphabet[Int(rng.next() % UInt64(alphabet.count))] }))
            // Either outcome is fine; a trap is not.
            _ = try? Self.parse("/v1/status?" + text)
            _ = try? Self.parse("/v1/status?key=" + text)
            guard let key = try? ObjectKey(validating: text) else { continue }
            var encoded = ""
            for byte in key.value.utf8 {
                let plain = (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || byte == 0x2F
                if plain && rng.next() % 2 == 0 {
                    encoded.unicodeScalars.append(Unicode.Scalar(byte))
                } else {
                    encoded += String(format: rng.next() % 2 == 0 ? "%%%02X" : "%%%02x", byte)
                }
            }
            #expect((try? Self.parse("/v1/status?key=" + encoded))?.query == .key(key.value), "seed \(seed): \(encoded)")
        }
    }
}
