import AsyncHTTPClient
import Foundation
import NIOCore

import UploadS3

/// The real S3 server of the run: tools/test starts SeaweedFS (tools/s3/seaweedfs.sh) and exports its address and
/// key; each test makes a bucket of its own in it and empties and deletes it after.
public struct S3TestServer: Sendable {
    public static let missing = """
        UPLOAD_S3_ENDPOINT is not set: these tests need a real S3 server. Run tools/test, which starts SeaweedFS, or \
        start one with: eval "$(tools/s3/seaweedfs.sh start /tmp/s3)" (and tools/s3/seaweedfs.sh stop /tmp/s3 after)
        """

    public let endpoint: S3Endpoint
    public let credentials: S3Credentials

    public init() throws {
        let environment = ProcessInfo.processInfo.environment
        guard let address = environment["UPLOAD_S3_ENDPOINT"], let url = URL(string: address),
            let key = environment["AWS_ACCESS_KEY_ID"], let secret = environment["AWS_SECRET_ACCESS_KEY"]
        else {
            throw TestSetupError(description: Self.missing)
        }
        self.endpoint = S3Endpoint(url: url, region: environment["UPLOAD_S3_REGION"] ?? "us-east-1")
        self.credentials = S3Credentials(accessKeyID: key, secretAccessKey: secret)
    }

    /// Runs `body` with a client and a new bucket, then deletes what the bucket holds, its unfinished uploads and the
    /// client, whether `body` threw or not.
    public static func withBucket(
        credentials: ((S3Credentials) -> S3Credentials)? = nil, _ body: (S3Client, String) async throws -> Void
    ) async throws {
        let server = try S3TestServer()
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let client = S3Client(endpoint: server.endpoint, credentials: server.credentials, http: http)
        let bucket = "test-\(UInt64.random(in: 0...UInt64.max) % 1_000_000_000_000)"
        var failure: (any Error)? = nil
        do {
            try await client.createBucket(bucket)
            let used = credentials.map { S3Client(endpoint: server.endpoint, credentials: $0(server.credentials), http: http) } ?? client
            try await body(used, bucket)
        } catch {
            failure = error
        }
        do {
            for upload in try await client.listMultipartUploads(bucket: bucket, prefix: "") {
                try await client.abortMultipartUpload(bucket: bucket, key: upload.key, uploadID: upload.uploadID)
            }
            for object in try await client.listObjects(bucket: bucket, prefix: "") {
                try await client.deleteObject(bucket: bucket, key: object.key)
            }
            try await client.deleteBucket(bucket)
        } catch {
            if failure == nil { failure = error }
        }
        try await http.shutdown()
        if let failure { throw failure }
    }
}

/// A test that needs a server this run did not start: says which and how to start it.
public struct TestSetupError: Error, CustomStringConvertible {
    public var description: String

    public init(description: String) {
        self.description = description
    }
}
