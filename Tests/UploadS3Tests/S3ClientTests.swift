import Foundation
import NIOCore
import Testing
import UploadChecksums
import UploadTestSupport

@testable import UploadS3

/// The S3 requests against a real server (SeaweedFS, started by tools/test): it checks SigV4, checksums and
/// If-None-Match, so a wrong signature, a wrong SHA-1 or a lost precondition fails here.
@Suite("S3 client, against SeaweedFS")
struct S3ClientTests {
    static func bytes(_ count: Int, seed: UInt64) -> ByteBuffer {
        var generator = SeededGenerator(seed: seed)
        var buffer = ByteBuffer()
        buffer.reserveCapacity(count)
        for _ in 0..<(count + 7) / 8 {
            buffer.writeInteger(generator.next(), endianness: .little)
        }
        buffer.moveWriterIndex(to: count)
        return buffer
    }

    static func sha1(_ buffer: ByteBuffer) -> String {
        Data(SHA1.hash(buffer.readableBytesView)).base64EncodedString()
    }

    @Test("PUT with SHA-1, HEAD, GET, ranged GET, DELETE: the bytes come back; a missing key is nil")
    func putAndRead() async throws {
        try await S3TestServer.withBucket { client, bucket in
            let body = Self.bytes(300_001, seed: 1)
            try await client.putObject(bucket: bucket, key: "acct/photos/a.jpg", body: body, sha1: Self.sha1(body))
            let info = try #require(try await client.headObject(bucket: bucket, key: "acct/photos/a.jpg"))
            #expect(info.size == 300_001)
            #expect(try await client.getObject(bucket: bucket, key: "acct/photos/a.jpg", maxBytes: 1 << 20) == body)
            let range = try await client.getObject(bucket: bucket, key: "acct/photos/a.jpg", range: 1000...1999, maxBytes: 1 << 20)
            #expect(range == body.getSlice(at: 1000, length: 1000))
            #expect(try await client.headObject(bucket: bucket, key: "acct/photos/none.jpg") == nil)
            try await client.deleteObject(bucket: bucket, key: "acct/photos/a.jpg")
            #expect(try await client.headObject(bucket: bucket, key: "acct/photos/a.jpg") == nil)
        }
    }

    @Test("a wrong x-amz-checksum-sha1 is refused (BadDigest) and nothing is stored; the error names the key")
    func wrongChecksum() async throws {
        try await S3TestServer.withBucket { client, bucket in
            let body = Self.bytes(4096, seed: 2)
            let wrong = Self.sha1(Self.bytes(4096, seed: 3))
            let error = await #expect(throws: S3Error.self) {
                try await client.putObject(bucket: bucket, key: "k/bad.bin", body: body, sha1: wrong)
            }
            #expect(error?.code == "BadDigest", "\(String(describing: error))")
            #expect(error?.description.contains("s3://\(bucket)/k/bad.bin") == true)
            let stored = try await client.headObject(bucket: bucket, key: "k/bad.bin")
            #expect(stored == nil)
        }
    }

    @Test("If-None-Match: * on PUT, on CompleteMultipartUpload and on copy: refused when the key holds an object, which stays")
    func ifNoneMatch() async throws {
        try await S3TestServer.withBucket { client, bucket in
            let first = Self.bytes(1000, seed: 4)
            try await client.putObject(bucket: bucket, key: "same", body: first, ifNoneMatch: true)
            let error = await #expect(throws: S3Error.self) {
                try await client.putObject(bucket: bucket, key: "same", body: Self.bytes(1000, seed: 5), ifNoneMatch: true)
            }
            #expect(error?.isPreconditionFailed == true, "\(String(describing: error))")

            let id = try await client.createMultipartUpload(bucket: bucket, key: "same")
            let part = try await client.uploadPart(bucket: bucket, key: "same", uploadID: id, number: 1, body: Self.bytes(100, seed: 6))
            let completeError = await #expect(throws: S3Error.self) {
                try await client.completeMultipartUpload(bucket: bucket, key: "same", uploadID: id, parts: [part], ifNoneMatch: true)
            }
            #expect(completeError?.isPreconditionFailed == true, "\(String(describing: completeError))")

            try await client.putObject(bucket: bucket, key: "other", body: Self.bytes(10, seed: 7))
            let copyError = await #expect(throws: S3Error.self) {
                try await client.copyObject(bucket: bucket, from: "other", to: "same", ifNoneMatch: true)
            }
            #expect(copyError?.isPreconditionFailed == true, "\(String(describing: copyError))")
            #expect(try await client.getObject(bucket: bucket, key: "same", maxBytes: 1 << 20) == first)
            // Without the condition the copy replaces it.
            try await client.copyObject(bucket: bucket, from: "other", to: "same")
            #expect(try await client.getObject(bucket: bucket, key: "same", maxBytes: 1 << 20) == Self.bytes(10, seed: 7))
        }
    }

    @Test("multipart with SHA-1 checksums: parts listed as uploaded, completed in order, the object exact; none left open")
    func multipart() async throws {
        try await S3TestServer.withBucket { client, bucket in
            let key = "acct/videos/Ferien 2026.mp4"
            let parts = [Self.bytes(5 << 20, seed: 8), Self.bytes(5 << 20, seed: 9), Self.bytes(123_457, seed: 10)]
            let id = try await client.createMultipartUpload(bucket: bucket, key: key, sha1Checksums: true)
            var uploaded: [S3Part] = []
            // Out of order on purpose: the numbers, not the order of arrival, make the object.
            for index in [1, 0, 2] {
                uploaded.append(
                    try await client.uploadPart(
                        bucket: bucket, key: key, uploadID: id, number: index + 1, body: parts[index], sha1: Self.sha1(parts[index])
                    )
                )
            }
            let listed = try await client.listParts(bucket: bucket, key: key, uploadID: id)
            #expect(listed.map(\.part.number) == [1, 2, 3])
            #expect(listed.map(\.size) == parts.map { Int64($0.readableBytes) })
            #expect(try await client.listMultipartUploads(bucket: bucket, prefix: "acct/").map(\.uploadID) == [id])
            try await client.completeMultipartUpload(bucket: bucket, key: key, uploadID: id, parts: uploaded, ifNoneMatch: true)
            var whole = ByteBuffer()
            for part in parts { whole.writeImmutableBuffer(part) }
            #expect(try await client.headObject(bucket: bucket, key: key)?.size == Int64(whole.readableBytes))
            #expect(try await client.getObject(bucket: bucket, key: key, maxBytes: 16 << 20) == whole)
            #expect(try await client.listMultipartUploads(bucket: bucket, prefix: "").isEmpty)
        }
    }

    @Test("a part whose SHA-1 is wrong is refused; the upload goes on with the right bytes")
    func partChecksum() async throws {
        try await S3TestServer.withBucket { client, bucket in
            let body = Self.bytes(70_000, seed: 11)
            let id = try await client.createMultipartUpload(bucket: bucket, key: "p", sha1Checksums: true)
            let error = await #expect(throws: S3Error.self) {
                try await client.uploadPart(bucket: bucket, key: "p", uploadID: id, number: 1, body: body, sha1: Self.sha1(Self.bytes(10, seed: 12)))
            }
            #expect(error?.code == "BadDigest", "\(String(describing: error))")
            let part = try await client.uploadPart(bucket: bucket, key: "p", uploadID: id, number: 1, body: body, sha1: Self.sha1(body))
            try await client.completeMultipartUpload(bucket: bucket, key: "p", uploadID: id, parts: [part])
            #expect(try await client.getObject(bucket: bucket, key: "p", maxBytes: 1 << 20) == body)
        }
    }

    @Test("an aborted upload is gone: not listed, and no part can be added")
    func abort() async throws {
        try await S3TestServer.withBucket { client, bucket in
            let id = try await client.createMultipartUpload(bucket: bucket, key: "gone")
            _ = try await client.uploadPart(bucket: bucket, key: "gone", uploadID: id, number: 1, body: Self.bytes(1000, seed: 13))
            try await client.abortMultipartUpload(bucket: bucket, key: "gone", uploadID: id)
            #expect(try await client.listMultipartUploads(bucket: bucket, prefix: "").isEmpty)
            await #expect(throws: S3Error.self) {
                try await client.completeMultipartUpload(
                    bucket: bucket, key: "gone", uploadID: id, parts: [S3Part(number: 1, etag: "\"x\"")]
                )
            }
            #expect(try await client.headObject(bucket: bucket, key: "gone") == nil)
            // Aborting again is fine.
            try await client.abortMultipartUpload(bucket: bucket, key: "gone", uploadID: id)
        }
    }

    @Test("keys with spaces, non-ASCII and reserved characters: signed, stored and listed under their own names")
    func awkwardKeys() async throws {
        try await S3TestServer.withBucket { client, bucket in
            let keys = ["acct/in progress/a b.jpg", "acct/Été/ü+ß=€&x.jpg", "acct/(1)!~'*,;:@$.bin", "acct/%41 not an escape"]
            for (index, key) in keys.enumerated() {
                try await client.putObject(bucket: bucket, key: key, body: Self.bytes(100 + index, seed: UInt64(20 + index)))
            }
            let listed = try await client.listObjects(bucket: bucket, prefix: "acct/")
            #expect(Set(listed.map(\.key)) == Set(keys))
            #expect(try await client.listObjects(bucket: bucket, prefix: "acct/in progress/").map(\.key) == [keys[0]])
            for (index, key) in keys.enumerated() {
                #expect(try await client.getObject(bucket: bucket, key: key, maxBytes: 1 << 20) == Self.bytes(100 + index, seed: UInt64(20 + index)))
            }
        }
    }

    @Test("a wrong secret: SignatureDoesNotMatch, and the message says which setting to check")
    func wrongSecret() async throws {
        try await S3TestServer.withBucket(credentials: { S3Credentials(accessKeyID: $0.accessKeyID, secretAccessKey: "wrong") }) { client, bucket in
            let error = await #expect(throws: S3Error.self) {
                try await client.putObject(bucket: bucket, key: "x", body: ByteBuffer(string: "x"))
            }
            #expect(error?.code == "SignatureDoesNotMatch", "\(String(describing: error))")
            #expect(error?.description.contains("AWS_SECRET_ACCESS_KEY") == true)
        }
    }
}

@Suite("S3 XML answers")
struct S3XMLTests {
    @Test("values by element name: entities and numeric references decoded, prefixes of other names skipped, empty elements")
    func values() async {
        let xml = """
            <?xml version="1.0"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><KeyCount>2</KeyCount>\
            <Contents><Key>a &amp; b &lt;c&gt; &#233;&#x20AC;</Key><Size>5</Size></Contents>\
            <Contents><Key>x&quot;y&apos;</Key><Size>7</Size></Contents><Prefix/><IsTruncated>false</IsTruncated></ListBucketResult>
            """
        #expect(S3XML.value(of: "Key", in: xml) == "a & b <c> é€")
        #expect(S3XML.value(of: "KeyCount", in: xml) == "2")
        #expect(S3XML.elements("Contents", in: xml).count == 2)
        #expect(S3XML.elements("Contents", in: xml).compactMap { S3XML.value(of: "Key", in: $0) } == ["a & b <c> é€", "x\"y'"])
        #expect(S3XML.value(of: "Prefix", in: xml) == "")
        #expect(S3XML.value(of: "Missing", in: xml) == nil)
        #expect(S3XML.unescape("&bogus; & &amp") == "&bogus; & &amp")
        #expect(S3XML.escape("\"e&t<>'") == "&quot;e&amp;t&lt;&gt;&apos;")
    }

    @Test("an error body: code, message, request id; a truncated body yields nil, never a crash")
    func errors() async {
        let xml = "<Error><Code>NoSuchKey</Code><Message>The key does not exist.</Message><RequestId>r1</RequestId></Error>"
        #expect(S3XML.value(of: "Code", in: xml) == "NoSuchKey")
        #expect(S3XML.value(of: "RequestId", in: xml) == "r1")
        for cut in 0..<xml.count {
            _ = S3XML.value(of: "Message", in: String(xml.prefix(cut)))
        }
        #expect(S3XML.value(of: "Code", in: "<Error><Code>NoSuch") == nil)
    }
}
