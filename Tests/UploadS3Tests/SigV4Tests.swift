import Foundation
import Testing

@testable import UploadS3

/// The signer against botocore's signatures of the same requests at the same time (tools/s3/sigv4_vectors.py made
/// the file; tools/test checks it still is botocore's).
@Suite("SigV4 signatures")
struct SigV4Tests {
    struct Vector: Decodable {
        var name: String
        var method: String
        var path: String
        var query: [[String]]
        var headers: [[String]]
        var region: String
        var time: String
        var token: String?
        var host: String
        var payload_hash: String
        var canonical_request: String
        var string_to_sign: String
        var signature: String
        var authorization: String
        var added_headers: [[String]]
        var access_key_id: String
        var secret_access_key: String
    }

    static let vectors: [Vector] = {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/sigv4-vectors.json")
        do {
            return try JSONDecoder().decode([Vector].self, from: Data(contentsOf: url))
        } catch {
            Issue.record("cannot read \(url.path): \(error)")
            return []
        }
    }()

    @Test("the vectors are there, and cover uploads=, an unsigned payload, a session token and encoded keys")
    func coverage() async {
        let names = Self.vectors.map(\.name)
        #expect(names.count >= 12)
        #expect(Self.vectors.contains { $0.canonical_request.contains("\nuploads=\n") })
        #expect(Self.vectors.contains { $0.payload_hash == SigV4Signer.unsignedPayload })
        #expect(Self.vectors.contains { $0.token != nil })
        #expect(Self.vectors.contains { $0.canonical_request.contains("%C3%89") })
    }

    @Test("canonical request, string to sign, signature and headers: as botocore's", arguments: SigV4Tests.vectors.map(\.name))
    func vector(_ name: String) async throws {
        let v = try #require(Self.vectors.first { $0.name == name })
        let signer = SigV4Signer(
            credentials: S3Credentials(accessKeyID: v.access_key_id, secretAccessKey: v.secret_access_key, sessionToken: v.token),
            region: v.region
        )
        var headers = v.headers.map { (name: $0[0], value: $0[1]) }
        headers.append((name: "host", value: v.host))
        let request = SigV4Signer.Request(
            method: v.method, path: v.path, query: v.query.map { (name: $0[0], value: $0[1]) }, headers: headers,
            payloadHash: v.payload_hash
        )
        let date = try #require(ISO8601DateFormatter().date(from: v.time + "Z"))
        let signed = signer.sign(request, at: date)
        #expect(signed.canonicalRequest == v.canonical_request)
        #expect(signed.stringToSign == v.string_to_sign)
        #expect(signed.signature == v.signature)
        let added = Dictionary(signed.headers.map { ($0.name, $0.value) }, uniquingKeysWith: { a, _ in a })
        #expect(added["authorization"] == v.authorization)
        for pair in v.added_headers { #expect(added[pair[0]] == pair[1], "\(pair[0])") }
    }

    @Test("a changed byte anywhere changes the signature: method, path, query, a header, the payload, the time, the key")
    func sensitivity() async throws {
        let signer = SigV4Signer(credentials: S3Credentials(accessKeyID: "AK", secretAccessKey: "SK"), region: "us-east-1")
        let base = SigV4Signer.Request(
            method: "PUT", path: "/b/k", query: [("partNumber", "1"), ("uploadId", "u")], headers: [("host", "h")],
            payloadHash: SigV4Signer.payloadHash(Array("x".utf8))
        )
        let date = Date(timeIntervalSince1970: 1_800_000_000)
        let reference = signer.sign(base, at: date).signature
        var variants: [SigV4Signer.Request] = []
        var r = base
        r.method = "POST"; variants.append(r)
        r = base; r.path = "/b/K"; variants.append(r)
        r = base; r.query[0].value = "2"; variants.append(r)
        r = base; r.headers[0].value = "h2"; variants.append(r)
        r = base; r.payloadHash = SigV4Signer.payloadHash(Array("y".utf8)); variants.append(r)
        for variant in variants { #expect(signer.sign(variant, at: date).signature != reference) }
        #expect(signer.sign(base, at: date + 1).signature != reference)
        let other = SigV4Signer(credentials: S3Credentials(accessKeyID: "AK", secretAccessKey: "SL"), region: "us-east-1")
        #expect(other.sign(base, at: date).signature != reference)
    }
}
